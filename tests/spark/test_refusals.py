"""Every refusal is a typed error and commits nothing: a commit timestamp below the log's upper
(contention), a read-set conflict, a schema version that is no longer one of the two latest, and
output that cannot be conformed to the pinned schema (extra column, narrowing type, missing NOT
NULL column without default, NULL in a NOT NULL column)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from metastore.errors import (
    CommitTimestampUnavailableError,
    LeaseVersionNotLatestError,
    ReadConflictError,
    SchemaVersionNotActiveError,
)
from spark_bridge.bridge import BatchError
from spark_bridge.conform import SchemaMismatchError, conform, pad_chars_on_read
from tests.spark.support import SparkEnv, committed_txns, rows_of, write_attempt

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

CONTENDED = "ref.contended"
SRC = "ref.src"
DST = "ref.dst"
EVOLVING = "ref.evolving"
STRICT = "ref.strict"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE ref")
    spark_env.ddl(
        f"CREATE TABLE {CONTENDED} (id BIGINT)",
        f"CREATE TABLE {SRC} (id BIGINT)",
        f"CREATE TABLE {DST} (id BIGINT)",
        f"CREATE TABLE {EVOLVING} (id BIGINT)",
        f"CREATE TABLE {STRICT} (id BIGINT NOT NULL, v INT, d STRING NOT NULL DEFAULT 'dflt')",
    )
    return spark_env


@contextmanager
def nothing_committed(env: SparkEnv, *tables: str) -> Iterator[None]:
    """The block may fail however it likes, but no commit to `tables` and no visible file in
    them may come of it."""

    def commits() -> list[dict[str, Any]]:
        return [c for c in committed_txns(env.client) if set(c["tables"]) & set(tables)]

    log = commits()
    live = {t: env.live_paths(t) for t in tables}
    yield
    after = env.client.clock.now()
    assert commits() == log
    assert {t: env.live_paths(t, as_of=after) for t in tables} == live


def _add(env: SparkEnv, table: str, txn_id: str, ids: list[int]) -> list[dict[str, Any]]:
    write, _ = write_attempt(env.client, table, txn_id, [{"id": i} for i in ids])
    return [write]


# ---- contention ------------------------------------------------------------------------------


def test_commit_below_the_upper_is_refused_with_the_upper(env: SparkEnv) -> None:
    first = env.client.commit("contend:1", _add(env, CONTENDED, "contend:1", [1]))
    writes = _add(env, CONTENDED, "contend:2", [2])
    with nothing_committed(env, CONTENDED), pytest.raises(CommitTimestampUnavailableError) as info:
        env.client.commit("contend:2", writes, ts=first["ts"])  # taken by contend:1
    err = info.value
    assert err.retryable
    assert err.details["ts"] == first["ts"]
    upper = err.details["upper"]
    assert isinstance(upper, int)
    assert upper > first["ts"]
    # The refusal suggests where to retry: the upper plus headroom for the retry's own, later
    # Tm. Retrying there commits exactly there.
    retry_ts = err.details["retry_at"]
    assert isinstance(retry_ts, int)
    assert retry_ts > upper
    # On a loaded machine the retry can still be stamped past the hint; a caller follows the
    # fresh hint each time (bounded).
    for _ in range(5):
        try:
            r = env.client.commit("contend:2", writes, ts=retry_ts)
            break
        except CommitTimestampUnavailableError as again:
            retry_ts = again.details["retry_at"]
            assert isinstance(retry_ts, int)
    else:
        pytest.fail("commit_at never succeeded at the suggested retry timestamps")
    assert r["ts"] == retry_ts and not r["deduplicated"]


# ---- read-set conflicts ----------------------------------------------------------------------


def test_read_set_conflict_fails_the_batch_naming_the_table(env: SparkEnv) -> None:
    bridge = env.bridge(app_name="conflicts")
    spark = env.spark
    with bridge.batch(writes=[SRC]) as seed:
        seed.write(SRC, spark.createDataFrame([(1,), (2,), (3,)], "id BIGINT"))
    # Without a concurrent writer the same batch commits: the check is not spuriously strict,
    # and the batch reads its own bridge's previous commit (whichever node it asks).
    with bridge.batch(reads=[SRC], writes=[DST], check_reads=True) as ok:
        assert seed.report.commit_ts is not None
        assert ok.read_ts >= seed.report.commit_ts
        ok.write(DST, ok.read(SRC))
    assert ok.report.commit_ts is not None
    assert rows_of(bridge.read_table(DST, as_of=ok.report.commit_ts)) == [(1,), (2,), (3,)]

    with (  # noqa: PT012 - the batch body runs inside pytest.raises; its commit raises
        nothing_committed(env, DST),
        pytest.raises(BatchError) as info,
        bridge.batch(reads=[SRC], writes=[DST], check_reads=True) as b,
    ):
        n = b.read(SRC).count()
        b.write(DST, spark.createDataFrame([(n,)], "id BIGINT"))
        # Another driver commits to the table this batch read, after its read_ts.
        other = env.client.commit("other:src", _add(env, SRC, "other:src", [4]))
    err = info.value
    assert err.retryable
    assert isinstance(err.cause, ReadConflictError)
    assert err.cause.details["table"] == SRC
    assert err.cause.details["read_ts"] == b.read_ts
    assert err.cause.details["commit_ts"] == other["ts"]
    assert err.cause.details["txn_id"] == "other:src"
    assert not any(c["txn_id"] == b.txn_id for c in committed_txns(env.client))


# ---- schema versions ---------------------------------------------------------------------------


def test_commit_with_a_version_older_than_the_two_latest_is_refused(env: SparkEnv) -> None:
    # Without leases (a token that may not lease, or a session lost mid-batch) only the commit
    # rule stands between a stale batch and the table: it must refuse.
    bridge = env.bridge(app_name="versions", leases=False)
    planned_at = env.client.clock.now()  # version 1 is in force here
    env.ddl(f"ALTER TABLE {EVOLVING} ADD COLUMN a INT")
    env.ddl(f"ALTER TABLE {EVOLVING} ADD COLUMN b INT")

    # A batch planned before both ALTERs (pinned v1) cannot commit after them.
    with (  # noqa: PT012 - the batch body runs inside pytest.raises; its commit raises
        nothing_committed(env, EVOLVING),
        pytest.raises(BatchError) as info,
        bridge.batch(writes=[EVOLVING], top=planned_at) as b,
    ):
        assert b.version(EVOLVING) == 1
        b.write(EVOLVING, env.spark.createDataFrame([(1,)], "id BIGINT"))
    err = info.value
    assert err.retryable
    assert isinstance(err.cause, SchemaVersionNotActiveError)
    assert err.cause.details["table"] == EVOLVING
    assert err.cause.details["version"] == 1
    assert err.cause.details["active_versions"] == [2, 3]

    # With leases the same batch is refused earlier, at planning, before any work: v1 can no
    # longer be leased.
    leased = env.bridge(app_name="versions-leased")
    with (
        nothing_committed(env, EVOLVING),
        pytest.raises(BatchError) as at_plan,
        leased.batch(writes=[EVOLVING], top=planned_at),
    ):
        pass
    assert at_plan.value.retryable
    assert isinstance(at_plan.value.cause, LeaseVersionNotLatestError)
    assert at_plan.value.cause.details["latest_versions"] == [2, 3]

    # The same through the client; the older of the two latest versions is still accepted.
    writes = _add(env, EVOLVING, "old-version", [1])
    writes[0]["schema_version"] = 1
    with nothing_committed(env, EVOLVING), pytest.raises(SchemaVersionNotActiveError) as direct:
        env.client.commit("old-version", writes)
    assert direct.value.retryable
    writes[0]["schema_version"] = 2
    assert env.client.commit("old-version", writes)["ts"] > 0


# ---- conform refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("id BIGINT, v INT, d STRING, extra STRING", "columns the pinned schema does not"),
        ("id BIGINT, v BIGINT, d STRING", "cannot be widened to the pinned int"),
        ("v INT, d STRING", "lacks NOT NULL column 'id'"),
    ],
    ids=["extra-column", "narrowing-type", "missing-not-null-column"],
)
def test_output_that_cannot_conform_is_refused(env: SparkEnv, ddl: str, message: str) -> None:
    bridge = env.bridge(app_name="conform")
    width = len(ddl.split(","))
    row = tuple(1 if "INT" in part else "x" for part in ddl.split(","))
    assert len(row) == width
    df = env.spark.createDataFrame([row], ddl)
    with (
        nothing_committed(env, STRICT),
        pytest.raises(SchemaMismatchError, match=message),
        bridge.batch(writes=[STRICT]) as b,
    ):
        b.write(STRICT, df)


def test_null_in_a_not_null_column_fails_the_job_and_commits_nothing(env: SparkEnv) -> None:
    bridge = env.bridge(app_name="conform")
    df = env.spark.createDataFrame([(1, 1, "a"), (None, 2, "b")], "id BIGINT, v INT, d STRING")
    # raise_error on the executors fails the Spark job; the batch never reaches its commit.
    with (
        nothing_committed(env, STRICT),
        pytest.raises(Exception, match=f"NULL in NOT NULL column {STRICT}.id"),
        bridge.batch(writes=[STRICT]) as b,
    ):
        b.write(STRICT, df)


def test_a_write_whose_files_the_driver_does_not_all_see_commits_nothing(
    env: SparkEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a cluster whose executors write to their own local disks: the driver lists only
    # part of what Spark wrote (here one of two files is hidden from it). Committing what it
    # sees would drop rows without an error.
    import spark_bridge.bridge as bridge_module

    real = bridge_module.collect_files
    monkeypatch.setattr(bridge_module, "collect_files", lambda *a: real(*a)[1:])
    bridge = env.bridge(app_name="conform")
    df = env.spark.createDataFrame([(i, i, "a") for i in range(4)], "id BIGINT, v INT, d STRING")
    with (
        nothing_committed(env, STRICT),
        pytest.raises(BatchError, match=r"Spark wrote 4 rows under .* but the driver finds"),
        bridge.batch(writes=[STRICT]) as b,
    ):
        b.write(STRICT, df.repartition(2))


def test_conformable_output_is_widened_and_defaulted(env: SparkEnv) -> None:
    # The control for the refusals above: a narrower type and a missing column with a DEFAULT.
    bridge = env.bridge(app_name="conform")
    df = env.spark.createDataFrame([(7, 1)], "id INT, v SMALLINT")
    with bridge.batch(writes=[STRICT]) as b:
        b.write(STRICT, df)
    assert b.report.commit_ts is not None
    assert rows_of(bridge.read_table(STRICT, as_of=b.report.commit_ts)) == [(7, 1, "dflt")]


# ---- a table re-created between read_ts and Top ----------------------------------------------


def test_a_table_recreated_between_read_ts_and_top_is_not_read_with_the_new_schema(
    env: SparkEnv,
) -> None:
    """Field ids restart at 1 in a new incarnation: the old files read with the new struct would
    silently put `a`'s values under `b`. The batch must refuse (retryably) instead."""
    table = "ref.reborn"
    env.ddl(f"CREATE TABLE {table} (a BIGINT, b BIGINT)")
    write, _ = write_attempt(env.client, table, "reborn:1", [{"a": 1, "b": 2}])
    old_ts = env.client.commit("reborn:1", [write])["ts"]
    env.ddl(f"DROP TABLE {table}")
    env.ddl(f"CREATE TABLE {table} (b BIGINT, a BIGINT)")  # same names, swapped field ids
    bridge = env.bridge(app_name="reborn")
    with pytest.raises(BatchError) as info, bridge.batch(reads=[table], read_ts=old_ts) as b:
        b.read(table).collect()
    assert info.value.retryable
    assert "re-created" in str(info.value)
    # Planned after the re-creation with a read_ts the new incarnation covers, it reads fine.
    with bridge.batch(reads=[table]) as b:
        assert b.read(table).collect() == []


def test_a_micro_batch_overtaken_by_two_ddls_is_replanned_not_fatal(env: SparkEnv) -> None:
    """Without leases (a token that may not lease, or a session that expired under a batch), a
    long micro-batch whose pinned version is no longer one of the two latest at commit is
    refused; foreach_batch re-plans and runs it again (bounded) instead of killing the query,
    and only the successful attempt's files become visible. (With leases the second DDL waits
    instead: tests/spark/test_leases.py.)"""
    table = "ref.overtaken"
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="overtaken", leases=False)
    reports = []
    pinned = []

    def body(b: Any, df: Any) -> None:
        pinned.append(b.version(table))
        if len(pinned) == 1:  # the first attempt is slow: two DDLs land while it runs
            env.ddl(f"ALTER TABLE {table} ADD COLUMN x{len(pinned)} INT")
            env.ddl(f"ALTER TABLE {table} ADD COLUMN y{len(pinned)} INT")
        b.write(table, df)

    run = bridge.foreach_batch(
        body, query_name="overtaken", writes=[table], on_batch=reports.append
    )
    sc = env.spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", "overtaken-query")  # as a streaming query does
    try:
        run(env.spark.createDataFrame([(7,)], "id BIGINT"), 0)
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    assert pinned == [1, 3]
    assert [r.retries for r in reports] == [1]
    assert bridge.batch_retries == 1
    commit_ts = reports[0].commit_ts
    assert commit_ts is not None
    assert rows_of(bridge.read_table(table, as_of=commit_ts), "id") == [(7,)]


# ---- nested structs ----------------------------------------------------------------------------

NESTED = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "s", "type": "STRUCT<a: INT, b: INT>", "nullable": True},
]


def test_struct_fields_in_another_order_are_refused_not_swapped(spark: SparkSession) -> None:
    # Spark casts a struct to a struct by position: struct<b, a> cast to the pinned
    # struct<a, b> would write b's values into a and a's into b, silently.
    df = spark.createDataFrame([(1, (10, 20))], "id BIGINT, s STRUCT<b: INT, a: INT>")
    with pytest.raises(SchemaMismatchError, match="'s'"):
        conform(df, "ref.nested", NESTED)
    # A struct missing a nested field cannot be cast at all: a typed refusal, not Spark's
    # AnalysisException.
    df = spark.createDataFrame([(1, (10,))], "id BIGINT, s STRUCT<a: INT>")
    with pytest.raises(SchemaMismatchError, match="'s'"):
        conform(df, "ref.nested", NESTED)
    # The control: the same fields in the pinned order (case aside), one of them widened.
    df = spark.createDataFrame([(1, (10, 20))], "id BIGINT, s STRUCT<A: SMALLINT, b: INT>")
    out = conform(df, "ref.nested", NESTED)
    assert [tuple(r) for r in out.collect()] == [(1, (10, 20))]
    assert [r.s.a for r in out.collect()] == [10]


def test_output_columns_differing_only_in_case_are_refused(spark: SparkSession) -> None:
    # Matched case-insensitively, `v` and `V` are both the pinned column v: which one to write
    # is ambiguous, so the output is refused with a typed error (not Spark's AnalysisException).
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "v", "type": "INT", "nullable": True},
    ]
    df = spark.createDataFrame([(1, 5, 6)], "id BIGINT, v INT, V INT")
    with pytest.raises(SchemaMismatchError, match="more than once"):
        conform(df, "ref.cased", columns)


def test_a_value_longer_than_its_varchar_is_refused(spark: SparkSession) -> None:
    # VARCHAR(n)/CHAR(n) are STRING in the DataFrame: the length limit is checked per row, as
    # NOT NULL is, instead of committing a value the table's type does not allow.
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "code", "type": "VARCHAR(3)", "nullable": True},
        {"field_id": 3, "name": "flag", "type": "CHAR(1)", "nullable": True},
    ]
    ok = spark.createDataFrame(
        [(1, "abc", "y"), (2, None, None)], "id BIGINT, code STRING, flag STRING"
    )
    assert sorted(tuple(r) for r in conform(ok, "ref.codes", columns).collect()) == [
        (1, "abc", "y"),
        (2, None, None),
    ]
    long = spark.createDataFrame([(1, "abcd", "y")], "id BIGINT, code STRING, flag STRING")
    with pytest.raises(Exception, match=r"longer than 3 characters in ref\.codes\.code"):
        conform(long, "ref.codes", columns).collect()
    wide = spark.createDataFrame([(1, "abc", "yes")], "id BIGINT, code STRING, flag STRING")
    with pytest.raises(Exception, match=r"longer than 1 characters in ref\.codes\.flag"):
        conform(wide, "ref.codes", columns).collect()


def test_trailing_spaces_beyond_a_varchar_length_are_trimmed_as_spark_does(
    spark: SparkSession,
) -> None:
    # Spark's table write trims trailing spaces beyond n for VARCHAR(n)/CHAR(n) ('ab   ' is
    # stored 'ab ', measured with pyspark 4) and the DDL accepts VARCHAR(3) DEFAULT 'ab   ' as
    # Spark does; conform compared the raw length, so every write filling that default failed.
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "code", "type": "VARCHAR(3)", "nullable": True},
        {
            "field_id": 3,
            "name": "filled",
            "type": "VARCHAR(3)",
            "nullable": False,
            "default": "'ab   '",
        },
    ]
    df = spark.createDataFrame([(1, "abc  "), (2, "a    "), (3, None)], "id BIGINT, code STRING")
    assert sorted(tuple(r) for r in conform(df, "ref.codes", columns).collect()) == [
        (1, "abc", "ab "),
        (2, "a  ", "ab "),
        (3, None, "ab "),
    ]
    tab = spark.createDataFrame([(1, "ab \t")], "id BIGINT, code STRING")
    with pytest.raises(Exception, match=r"longer than 3 characters in ref\.codes\.code"):
        conform(tab, "ref.codes", columns).collect()


def test_char_values_are_padded_to_their_length_as_spark_stores_them(spark: SparkSession) -> None:
    # Spark's table write pads CHAR(n) values shorter than n with spaces ('a' and '' are stored
    # 'a  ' and '   ' in a CHAR(3), its DEFAULT 'a' too; measured with pyspark 4.3); NULL stays
    # NULL and VARCHAR is not padded. conform stored 'a', so `WHERE c = 'a  '` and joins on
    # rows written through the bridge disagreed with rows Spark wrote.
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "c", "type": "CHAR(3)", "nullable": True},
        {"field_id": 3, "name": "v", "type": "VARCHAR(3)", "nullable": True},
        {"field_id": 4, "name": "filled", "type": "CHAR(3)", "nullable": False, "default": "'a'"},
    ]
    df = spark.createDataFrame(
        [(1, "a", "a"), (2, "", ""), (3, None, None), (4, "ab     ", "ab     ")],
        "id BIGINT, c STRING, v STRING",
    )
    assert sorted(tuple(r) for r in conform(df, "ref.chars", columns).collect()) == [
        (1, "a  ", "a", "a  "),
        (2, "   ", "", "a  "),
        (3, None, None, "a  "),
        (4, "ab ", "ab ", "a  "),
    ]


def test_the_bridge_reads_char_values_padded_as_spark_and_the_other_readers_do(
    spark: SparkSession,
) -> None:
    # The bridge reads CHAR(n) as STRING, so Spark's read-side padding did not apply: values
    # written unpadded (before the writers padded) and a CHAR column's DEFAULT in older rows
    # read 'a' through the bridge and 'a  ' through the CLI and the data source.
    columns = [
        {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
        {"field_id": 2, "name": "c", "type": "CHAR(3)", "nullable": True},
        {"field_id": 3, "name": "v", "type": "VARCHAR(3)", "nullable": True},
    ]
    df = spark.createDataFrame(
        [(1, "a", "a"), (2, "", ""), (3, None, None), (4, "abcde", "abcde")],
        "id BIGINT, c STRING, v STRING",
    )
    read = pad_chars_on_read(df, columns)
    assert sorted(tuple(r) for r in read.collect()) == [
        (1, "a  ", "a"),
        (2, "   ", ""),
        (3, None, None),
        (4, "abcde", "abcde"),  # longer values as they are, as Spark reads them
    ]
    assert read.columns == ["id", "c", "v"]


def test_columns_named_with_backquotes_or_dots_are_written(spark: SparkSession) -> None:
    # The metastore takes any column name (CREATE TABLE t (`a``b` BIGINT)); conform referred to
    # an output column as `name` without doubling an embedded backquote, so Spark refused to
    # parse the reference and no write to such a table could ever succeed.
    columns = [
        {"field_id": 1, "name": "a`b", "type": "BIGINT", "nullable": True},
        {"field_id": 2, "name": "c.d", "type": "BIGINT", "nullable": True},
    ]
    df = spark.createDataFrame([(1, 2)], "`a``b` BIGINT, `c.d` INT")
    out = conform(df, "ref.odd", columns)
    assert out.columns == ["a`b", "c.d"]
    assert [tuple(r) for r in out.collect()] == [(1, 2)]


def test_a_table_whose_location_holds_glob_characters_is_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Spark's file readers expand glob characters in a path: the files of a table at
    # LOCATION '.../t[1]' were written (Spark's writers take the path literally) but every
    # read of them failed with PATH_NOT_FOUND.
    from types import SimpleNamespace

    from spark_bridge.bridge import BatchContext, BatchReport, MetastoreBridge
    from spark_bridge.conform import pinned_struct

    location = str(tmp_path / "t[1]")
    columns = [{"field_id": 1, "name": "id", "type": "BIGINT", "nullable": True}]
    # As a bridge sets them: Parquet field ids written and read.
    spark.conf.set("spark.sql.parquet.fieldId.read.enabled", "true")
    spark.conf.set("spark.sql.parquet.fieldId.write.enabled", "true")
    out = conform(spark.createDataFrame([(1,), (2,)], "id BIGINT"), "ref.glob", columns)
    out.coalesce(1).write.parquet(f"{location}/_txn/a")
    (name,) = [p.name for p in Path(location, "_txn", "a").glob("*.parquet")]
    listing = {
        "table": "ref.glob",
        "table_id": 3,
        "as_of": 10,
        "location": location,
        "files": [{"path": f"_txn/a/{name}"}],
        "deletes": [],
        "next_page_token": None,
    }
    bridge = object.__new__(MetastoreBridge)  # what `read_files` needs of a bridge
    bridge.spark = spark
    bridge._by_name_verdicts, bridge._verdicts_lock = {}, threading.Lock()
    bridge.footers_checked = 0
    batch = object.__new__(BatchContext)
    batch.spark = spark
    batch.bridge = bridge
    batch.client = SimpleNamespace(  # type: ignore[assignment]
        call=lambda op, args: {"as_of": 10, "listings": [listing], "waited_ms": 0.0}
    )
    batch.txn_id = "t-glob"
    batch.reads = ["ref.glob"]
    batch._requested_read_ts = None
    batch._listings, batch._listed = {}, set()
    batch.pinned = {
        "ref.glob": SimpleNamespace(  # type: ignore[dict-item]
            table_id=3, location=location, struct=pinned_struct(columns), columns=columns
        )
    }
    batch.report = BatchReport(txn_id="t-glob", top=10, read_ts=10, waited_ms=0.0)
    assert sorted(r.id for r in batch.read("ref.glob").collect()) == [1, 2]


# ---- nested NOT NULL fields and nested CHAR/VARCHAR ----------------------------------------------

NESTED_STRICT = "ref.nested_strict"
NESTED_STRICT_DDL = (
    f"CREATE TABLE {NESTED_STRICT} (id BIGINT NOT NULL, s STRUCT<a: INT NOT NULL, b: INT>, "
    "l ARRAY<STRUCT<x: INT NOT NULL>>, m MAP<STRING, STRUCT<y: INT NOT NULL>>)"
)
# What a DataFrame read from files, a join or createDataFrame gives: every nested field nullable.
NESTED_STRICT_INPUT = (
    "id BIGINT, s STRUCT<a: INT, b: INT>, l ARRAY<STRUCT<x: INT>>, m MAP<STRING, STRUCT<y: INT>>"
)


def test_nullable_input_for_nested_not_null_fields_is_checked_per_row(env: SparkEnv) -> None:
    # As Spark's own table writes: a nested NOT NULL field takes input merely declared nullable
    # and fails the write only when a NULL actually reaches it. conform refused the output as
    # "cannot be widened" however clean its values, so such tables could not be written from
    # files or joins at all.
    env.ddl(NESTED_STRICT_DDL)
    bridge = env.bridge(app_name="nested-not-null")
    rows = [
        (1, (1, None), [(5,), None], {"k": (7,), "n": None}),
        (2, None, None, None),  # a NULL struct, array or map holds no NULL field
    ]
    with bridge.batch(writes=[NESTED_STRICT]) as b:
        b.write(NESTED_STRICT, env.spark.createDataFrame(rows, NESTED_STRICT_INPUT))
    assert b.report.commit_ts is not None
    expected = [
        (1, (1, None), [(5,), None], {"k": (7,), "n": None}),
        (2, None, None, None),
    ]
    # Read back by the bridge and by the pyarrow reader (format("metastore"), the CLI's): the
    # files hold these fields as nullable (Spark wrote the output's nullability).
    bridge_read = bridge.read_table(NESTED_STRICT, as_of=b.report.commit_ts)
    arrow_read = (
        env.spark.read.format("metastore")
        .option("table", NESTED_STRICT)
        .option("as_of", str(b.report.commit_ts))
        .load()
    )
    for back in (bridge_read, arrow_read):
        assert (
            sorted(
                (
                    r.id,
                    r.s and tuple(r.s),
                    r.l and [e and tuple(e) for e in r.l],
                    r.m and {k: v and tuple(v) for k, v in r.m.items()},
                )
                for r in back.collect()
            )
            == expected
        )

    # A NULL in a NOT NULL nested field fails the batch with a typed error naming the field.
    from spark_bridge.conform import NotNullViolationError

    bad = [(3, (None, 1), [], {})]
    with (
        nothing_committed(env, NESTED_STRICT),
        pytest.raises(NotNullViolationError) as info,
        bridge.batch(writes=[NESTED_STRICT]) as b,
    ):
        b.write(NESTED_STRICT, env.spark.createDataFrame(bad, NESTED_STRICT_INPUT))
    assert info.value.table == NESTED_STRICT
    assert info.value.field_path == "s.a"
    assert f"NULL in NOT NULL field {NESTED_STRICT}.s.a" in str(info.value)
    # Inside an array's elements and a map's values too, each named by its path.
    columns = env.client.schema_at(NESTED_STRICT)["schema"]["columns"]
    for row, path in [
        ((4, (1, 1), [(1,), (None,)], {}), "l.element.x"),
        ((5, (1, 1), [], {"k": (None,)}), "m.value.y"),
    ]:
        df = env.spark.createDataFrame([row], NESTED_STRICT_INPUT)
        with pytest.raises(Exception, match=rf"NULL in NOT NULL field {NESTED_STRICT}\.{path}"):
            conform(df, NESTED_STRICT, columns).collect()
    # Top-level NOT NULL is typed the same way at the bridge.
    with (
        nothing_committed(env, STRICT),
        pytest.raises(NotNullViolationError) as top,
        bridge.batch(writes=[STRICT]) as b,
    ):
        b.write(STRICT, env.spark.createDataFrame([(None, 1, "a")], "id BIGINT, v INT, d STRING"))
    assert (top.value.table, top.value.field_path) == (STRICT, "id")


NESTED_CHARS = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "s", "type": "STRUCT<c: CHAR(3), v: VARCHAR(3)>", "nullable": True},
    {"field_id": 3, "name": "a", "type": "ARRAY<CHAR(3)>", "nullable": True},
    {
        "field_id": 4,
        "name": "m",
        "type": "MAP<CHAR(2), ARRAY<STRUCT<c: CHAR(2)>>>",
        "nullable": True,
    },
]
NESTED_CHARS_INPUT = (
    "id BIGINT, s STRUCT<c: STRING, v: STRING>, a ARRAY<STRING>, "
    "m MAP<STRING, ARRAY<STRUCT<c: STRING>>>"
)


def test_nested_char_values_are_padded_and_checked_as_spark_does(spark: SparkSession) -> None:
    # Spark's table writes pad a CHAR(n) value shorter than n inside structs, arrays and maps
    # (keys too) and refuse a nested VARCHAR(n)/CHAR(n) value longer than n, as at the top
    # level; its reads pad nested CHAR too (spark.sql.readSideCharPadding). Measured with
    # pyspark 4.3 on a Parquet catalog table (`INSERT` of named_struct('x', 'b') into
    # STRUCT<x: CHAR(3)> stores and reads 'b  '). conform and the bridge's read padded the
    # top level only.
    df = spark.createDataFrame(
        [(1, ("a", "b  "), ["c", None], {"k": [("d",), None]}), (2, None, None, None)],
        NESTED_CHARS_INPUT,
    )
    out = sorted(conform(df, "ref.nested_chars", NESTED_CHARS).collect(), key=lambda r: r.id)
    assert (tuple(out[0].s), out[0].a) == (("a  ", "b  "), ["c  ", None])
    assert {k: [e and tuple(e) for e in v] for k, v in out[0].m.items()} == {"k ": [("d ",), None]}
    assert (out[1].s, out[1].a, out[1].m) == (None, None, None)
    for row, where in [
        ((1, ("a", "abcd"), [], {}), "s.v"),
        ((1, ("a", "a"), ["abcd"], {}), "a.element"),
        ((1, ("a", "a"), [], {"abc": []}), "m.key"),
        ((1, ("a", "a"), [], {"k": [("abc",)]}), "m.value.element.c"),
    ]:
        long = spark.createDataFrame([row], NESTED_CHARS_INPUT)
        with pytest.raises(Exception, match=rf"longer than \d characters in ref\.x\.{where}\b"):
            conform(long, "ref.x", NESTED_CHARS).collect()
    # The bridge's read pads nested CHAR as Spark reads it (values stored unpadded earlier).
    read = pad_chars_on_read(df, NESTED_CHARS)
    first = sorted(read.collect(), key=lambda r: r.id)[0]
    assert (tuple(first.s), first.a) == (("a  ", "b  "), ["c  ", None])
    assert {k: [e and tuple(e) for e in v] for k, v in first.m.items()} == {"k ": [("d ",), None]}
    assert read.schema.names == ["id", "s", "a", "m"]
