"""Multi-step schema change jobs with real Spark (local[2]) against a real 3-node cluster.

* ADD COLUMN n INT NOT NULL DEFAULT 7 on a table with files: the job stops at "backfill"; readers
  do not see n meanwhile; a batch (and a data source append) pinned to a version where n is
  write-only writes n = 7 into its Parquet files, with n's field id; `run_backfill` rewrites
  exactly the older files in one commit, every live file then carries n, the job goes public,
  old rows read 7 and no row is lost or changed; AS OF before the job reads the old shape.
* The same through the CLI (`run-backfill`), with the daemon refusing the first report once
  (BACKFILL_INCOMPLETE): the command runs again and reports; it refuses a finished or unknown job.
* DROP COLUMN: from the job's first step readers no longer see the column while writers pinned
  there still write it; the job completes once the lease on the version before is gone; the other
  columns keep their data; AS OF before the job still shows the column.
* Every widening the catalog allows is one ALTER, one version, no job, and Spark (both Parquet
  readers) and the data source read the files written with the narrower types.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from metastore.client import SyncMetastoreClient
from metastore.errors import BackfillIncompleteError
from spark_bridge import backfill
from spark_bridge.backfill import JobNotBackfillableError
from spark_bridge.files import absolute, top_level_field_ids
from tests.daemon.harness import metastore_cluster
from tests.spark.support import SparkEnv, rows_of, wait_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.slow

NS = "sjobs"
WAIT_S = 30.0  # the bound of every wait here
HOLD_TTL_MS = 2_000  # a silent session holds a job this long


@pytest.fixture(scope="module")
def spark_env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    """A cluster with short DD and CSmax: every job step waits DD + CSmax at least."""
    with metastore_cluster(
        tmp_path_factory.mktemp("schema-jobs"), dd_ms=300, cs_max_ms=100
    ) as cluster:
        cluster.start_all()
        cluster.wait_ready()
        env = SparkEnv(cluster, spark)
        env.ddl(f"CREATE NAMESPACE {NS}")
        try:
            yield env
        finally:
            env.close()


# ------------------------------------------------------------------------------------ helpers


def _wait_job(
    client: SyncMetastoreClient, job_id: int, pred: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = client.job_show(job_id)
        return job if pred(job) else None

    return wait_until(check, timeout_s=WAIT_S, what=f"job {job_id}: {what}")


def _at_backfill(job: dict[str, Any]) -> bool:
    return bool(job["step"] == "backfill" and job["waiting_for"]["reason"] == "backfill")


def _succeeded(job: dict[str, Any]) -> bool:
    return bool(job["status"] == "succeeded")


def _wait_active(env: SparkEnv, table: str, names: list[str]) -> None:
    """Until the schema in force now has these columns: a job's last version activates DD after
    the step that published it."""

    def check() -> bool:
        return [c["name"] for c in env.client.schema_at(table)["schema"]["columns"]] == names

    wait_until(check, timeout_s=WAIT_S, what=f"{table} to read as {names}")


def _field_id(env: SparkEnv, table: str, name: str, as_of: int | None = None) -> int:
    view = env.client.schema_at(table, ts=as_of) if as_of else env.client.describe(table)
    [col] = [c for c in view["schema"]["columns"] if c["name"] == name]
    return int(col["field_id"])


def _column_values(location: str, rel_path: str, field_id: int) -> list[Any]:
    """The values a Parquet file stores for the column with `field_id` (by footer id)."""
    table = pq.read_table(absolute(location, rel_path))
    for i, f in enumerate(table.schema):
        if (f.metadata or {}).get(b"PARQUET:field_id") == str(field_id).encode():
            return list(table.column(i).to_pylist())
    raise AssertionError(f"{rel_path} has no column with field id {field_id}")


def _names(df: DataFrame) -> list[str]:
    return list(df.columns)


# ------------------------------------------------------------------------ ADD ... NOT NULL DEFAULT


def test_add_column_not_null_default_is_backfilled_by_spark(spark_env: SparkEnv) -> None:
    env, spark = spark_env, spark_env.spark
    table = f"{NS}.add"
    env.ddl(f"CREATE TABLE {table} (id BIGINT NOT NULL, name STRING)")
    bridge = env.bridge(app_name="schema-jobs-add")
    old_rows = [(i, f"n{i}") for i in range(100)]
    for part in (old_rows[:60], old_rows[60:]):  # two commits, several files
        with bridge.batch(writes=[table]) as b:
            b.write(table, spark.createDataFrame(part, "id BIGINT, name STRING").repartition(2))
    before_job = b.report.commit_ts
    assert before_job is not None
    location = env.location(table)
    old_paths = env.live_paths(table, as_of=before_job)
    assert len(old_paths) >= 3

    started = env.client.ddl(f"ALTER TABLE {table} ADD COLUMN n INT NOT NULL DEFAULT 7")
    job_id = int(started["job_id"])
    job = _wait_job(env.client, job_id, _at_backfill, "waits for its backfill")
    assert (job["kind"], job["column"], job["status"]) == ("add_column", "n", "running")
    assert job["backfill_needed"] is True
    n_id = int(job["field_id"])
    assert len(job["versions"]) == 3  # delete_only, write_only, backfill

    # Readers do not see n while it is write-only: the bridge, the data source, the catalog.
    assert _names(bridge.read_table(table)) == ["id", "name"]
    source = spark.read.format("metastore").option("table", table)
    assert _names(source.load()) == ["id", "name"]
    assert [c["name"] for c in env.client.describe(table)["schema"]["columns"]] == ["id", "name"]

    # Writers pinned now write n = 7: the batch API...
    with bridge.batch(writes=[table]) as b:
        pin = b.pinned[table]
        assert pin.version in job["versions"][1:]  # a version where n is write-only
        assert [c["name"] for c in pin.columns] == ["id", "name"]
        assert [(c["name"], c["nullable"]) for c in pin.write_columns] == [
            ("id", False),
            ("name", True),
            ("n", False),
        ]
        written = b.write(
            table,
            spark.createDataFrame(
                [(100 + i, f"w{i}") for i in range(10)], "id BIGINT, name STRING"
            ),
        )
    assert written
    for f in written:
        assert _column_values(location, f.path, n_id) == [7] * f.row_count
    # ...and the data source's append (its pyarrow writer fills the DEFAULT itself).
    before_append = env.live_paths(table)
    spark.createDataFrame([(200, "ds")], "id BIGINT, name STRING").write.format("metastore").option(
        "table", table
    ).mode("append").save()
    appended = env.live_paths(table) - before_append  # one file per task that got rows
    assert appended
    assert [v for p in appended for v in _column_values(location, p, n_id)] == [7]
    # Still hidden, still waiting: those writes did not need a backfill.
    assert _names(bridge.read_table(table)) == ["id", "name"]
    assert _at_backfill(env.client.job_show(job_id))

    said: list[str] = []
    result = bridge.run_backfill(job_id, timeout_s=WAIT_S, progress=said.append)
    assert result.files_rewritten == len(old_paths)  # the old files, and only those
    assert (result.commits, result.attempts, result.rows_rewritten) == (1, 1, 100)
    assert result.commit_ts is not None and result.snapshot_ts < result.commit_ts
    assert any("without column n" in line for line in said), said

    done = _wait_job(env.client, job_id, _succeeded, "succeeds")
    assert done["backfill_ts"] == result.snapshot_ts
    assert done["files_rewritten"] == len(old_paths)
    live = env.live_paths(table)
    assert not live & old_paths
    for path in live:
        assert n_id in top_level_field_ids(location, path), path
        assert set(_column_values(location, path, n_id)) <= {7}, path
    _wait_active(env, table, ["id", "name", "n"])

    expected = [(i, name, 7) for i, name in old_rows]
    expected += [(100 + i, f"w{i}", 7) for i in range(10)] + [(200, "ds", 7)]
    now = bridge.read_table(table)
    assert _names(now) == ["id", "name", "n"]
    assert rows_of(now) == sorted(expected)
    assert rows_of(source.load()) == sorted(expected)
    # AS OF before the job: the old shape and exactly the old rows (the old files are still
    # there for time travel: the rewrite only removed them from the live set).
    then = bridge.read_table(table, as_of=before_job)
    assert _names(then) == ["id", "name"]
    assert rows_of(then) == sorted(old_rows)


def _cli(env: SparkEnv, *args: str) -> Any:
    """Invoke `run-backfill` through a throwaway group with the real root's global options
    (it is registered under `metastore job` elsewhere)."""
    from cli.job_backfill import run_backfill
    from cli.main import RootGroup, cli

    root = RootGroup(
        name="metastore",
        params=list(cli.params),
        callback=cli.callback,
        commands={"run-backfill": run_backfill},
    )
    return CliRunner().invoke(
        root,
        ["--endpoints", ",".join(env.endpoints), "--token", env.token, *args],
        prog_name="metastore",
    )


def test_the_cli_runs_the_backfill_again_when_the_report_is_refused(
    spark_env: SparkEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, spark = spark_env, spark_env.spark
    table = f"{NS}.cli"
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="schema-jobs-cli")
    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame([(i,) for i in range(20)], "id BIGINT").repartition(2))
    old_paths = env.live_paths(table)
    assert len(old_paths) == 2

    refused: list[int] = []
    original = SyncMetastoreClient.job_backfilled

    def refuse_once(self: SyncMetastoreClient, job_id: int, **kwargs: Any) -> dict[str, Any]:
        if not refused:
            refused.append(int(kwargs["snapshot_ts"]))
            raise BackfillIncompleteError("refused once by the test", details={"job_id": job_id})
        return original(self, job_id, **kwargs)

    monkeypatch.setattr(SyncMetastoreClient, "job_backfilled", refuse_once)
    monkeypatch.setattr(backfill, "CHUNK_FILES_MAX", 1)  # one commit per file
    # A silent session's lease on v1 holds the job at delete_only until the session expires.
    session_id = uuid.uuid4().hex
    env.client.session_open(session_id, app_name="silent", ttl_ms=HOLD_TTL_MS)
    env.client.pin([table], session_id=session_id)
    started = env.client.ddl(f"ALTER TABLE {table} ADD COLUMN tag STRING NOT NULL DEFAULT 'old'")
    job_id = int(started["job_id"])
    # Started at once: the command waits for the backfill step and says what it waits for.
    run = _cli(env, "-o", "json", "run-backfill", str(job_id), "--timeout", "30s")
    assert run.exit_code == 0, run.output + run.stderr
    doc = json.loads(run.stdout)
    assert doc["job_id"] == job_id and doc["table"] == table
    assert doc["attempts"] == 2 and doc["files_rewritten"] == len(old_paths)
    # One chunk (commit) per file; the first report was refused, and the second attempt's
    # listing found nothing left to rewrite.
    assert doc["commits"] == 2 and doc["commit_ts"] < doc["snapshot_ts"]
    assert doc["snapshot_ts"] > refused[0]
    assert "at step delete_only, waiting for leases" in run.stderr, run.stderr
    assert "attempt 1 refused" in run.stderr and "refused once by the test" in run.stderr
    monkeypatch.undo()

    _wait_job(env.client, job_id, _succeeded, "succeeds")
    _wait_active(env, table, ["id", "tag"])
    assert rows_of(bridge.read_table(table)) == [(i, "old") for i in range(20)]
    # A job that succeeded already: nothing to do, and not an error (an orchestrator's retry of
    # a run whose report was accepted must not fail); the result says what happened.
    again = _cli(env, "-o", "json", "run-backfill", str(job_id), "--timeout", "5s")
    assert again.exit_code == 0, again.output + again.stderr
    again_doc = json.loads(again.stdout)
    assert again_doc["outcome"] == "job_succeeded", again_doc
    assert f"job {job_id} succeeded: column tag of {table} is public" in again_doc["note"]
    assert again_doc["snapshot_ts"] == doc["snapshot_ts"] and again_doc["commits"] == 0
    # An unknown job: the CLI's not-found exit code (4).
    missing = _cli(env, "run-backfill", "99999", "--timeout", "5s")
    assert missing.exit_code == 4 and "SCHEMA_JOB_NOT_FOUND" in missing.stderr


# ------------------------------------------------------------------------------------ DROP COLUMN


def test_drop_column_hides_it_at_once_and_keeps_the_other_columns(spark_env: SparkEnv) -> None:
    env, spark = spark_env, spark_env.spark
    table = f"{NS}.shrink"
    env.ddl(f"CREATE TABLE {table} (id BIGINT NOT NULL, a STRING, b INT)")
    bridge = env.bridge(app_name="schema-jobs-drop")
    old_rows = [(i, f"a{i}", i * 10) for i in range(30)]
    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame(old_rows, "id BIGINT, a STRING, b INT"))
    before_job = b.report.commit_ts
    assert before_job is not None
    a_id = _field_id(env, table, "a")
    location = env.location(table)
    holder = env.bridge(app_name="schema-jobs-drop-holder")

    # A batch pinned before the DROP holds its lease on v1: the job's second step waits for it.
    with holder.batch(writes=[table]) as held:
        assert held.version(table) == 1
        started = env.client.ddl(f"ALTER TABLE {table} DROP COLUMN a")
        job_id = int(started["job_id"])
        job = _wait_job(
            env.client,
            job_id,
            lambda j: (j["step"], j["waiting_for"]["reason"]) == ("write_only", "leases"),
            "is held at write_only by the lease",
        )
        assert job["kind"] == "drop_column" and job["column"] == "a"
        # Readers no longer see a...
        assert _names(bridge.read_table(table)) == ["id", "b"]
        assert _names(spark.read.format("metastore").option("table", table).load()) == ["id", "b"]
        # ...while a writer pinned now still writes it (nullable while it is dropped).
        with bridge.batch(writes=[table]) as b:
            pin = b.pinned[table]
            assert pin.version == job["versions"][0]
            assert [(c["name"], c["nullable"]) for c in pin.write_columns] == [
                ("id", False),
                ("b", True),
                ("a", True),
            ]
            [with_a] = b.write(
                table,
                spark.createDataFrame([(100, "kept", 1000)], "id BIGINT, a STRING, b INT").coalesce(
                    1
                ),
            )
            [without_a] = b.write(
                table, spark.createDataFrame([(101, 1010)], "id BIGINT, b INT").coalesce(1)
            )
        assert _column_values(location, with_a.path, a_id) == ["kept"]
        assert _column_values(location, without_a.path, a_id) == [None]
        # The held batch commits at v1 (still one of the two latest versions).
        held.write(table, spark.createDataFrame([(200, "v1", 2000)], "id BIGINT, a STRING, b INT"))
        assert _wait_job(env.client, job_id, lambda j: j["step"] == "write_only", "still held")

    done = _wait_job(env.client, job_id, _succeeded, "completes once the lease is gone")
    assert done["step"] == "dropped" and len(done["versions"]) == 2
    _wait_active(env, table, ["id", "b"])
    now = bridge.read_table(table)
    assert _names(now) == ["id", "b"]
    expected = [(i, b) for i, _, b in old_rows] + [(100, 1000), (101, 1010), (200, 2000)]
    assert rows_of(now) == sorted(expected)
    then = bridge.read_table(table, as_of=before_job)
    assert _names(then) == ["id", "a", "b"]
    assert rows_of(then) == sorted(old_rows)
    with pytest.raises(JobNotBackfillableError, match="drop_column"):
        bridge.run_backfill(job_id, timeout_s=5)


# ------------------------------------------------------------------------------------ widening

# (column, type before, type after, values written before) - every widening `is_widening` allows,
# with the decimal ones crossing Parquet's physical types (INT32 <= 9 digits < INT64 <= 18 < FLBA).
WIDENINGS: list[tuple[str, str, str, list[Any]]] = [
    ("t2s", "TINYINT", "SMALLINT", [-128, 127]),
    ("t2i", "TINYINT", "INT", [-128, 127]),
    ("t2l", "TINYINT", "BIGINT", [-128, 127]),
    ("s2i", "SMALLINT", "INT", [-32768, 32767]),
    ("s2l", "SMALLINT", "BIGINT", [-32768, 32767]),
    ("i2l", "INT", "BIGINT", [-(2**31), 2**31 - 1]),
    ("f2d", "FLOAT", "DOUBLE", [1.5, -0.25]),
    ("d2t", "DATE", "TIMESTAMP_NTZ", [dt.date(1970, 1, 1), dt.date(2026, 2, 28)]),
    ("dec_same", "DECIMAL(5,2)", "DECIMAL(9,2)", [Decimal("-999.99"), Decimal("123.45")]),
    ("dec_i64", "DECIMAL(5,2)", "DECIMAL(15,2)", [Decimal("-999.99"), Decimal("123.45")]),
    ("dec_flba", "DECIMAL(15,2)", "DECIMAL(30,2)", [Decimal("9999999999999.99"), Decimal("-1")]),
    ("dec_max", "DECIMAL(5,2)", "DECIMAL(38,2)", [Decimal("999.99"), Decimal("0.01")]),
    ("vc", "VARCHAR(5)", "VARCHAR(10)", ["abcde", ""]),
    ("vs", "VARCHAR(5)", "STRING", ["xyz", "q"]),
]


def _widened(value: Any) -> Any:
    """How a value written with the narrow type reads with the wide one."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return dt.datetime(value.year, value.month, value.day)
    return value


def test_every_widening_is_one_step_and_spark_reads_the_old_files(spark_env: SparkEnv) -> None:
    env, spark = spark_env, spark_env.spark
    table = f"{NS}.widen"
    env.ddl(
        f"CREATE TABLE {table} (id INT NOT NULL, "
        + ", ".join(f"{name} {old}" for name, old, _, _ in WIDENINGS)
        + ")"
    )
    bridge = env.bridge(app_name="schema-jobs-widen")
    narrow_schema = "id INT, " + ", ".join(
        f"{name} {'STRING' if old.startswith('VARCHAR') else old}" for name, old, _, _ in WIDENINGS
    )
    old_rows = [(row, *(values[row] for _, _, _, values in WIDENINGS)) for row in range(2)]
    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame(old_rows, narrow_schema).coalesce(1))
    before_alters = b.report.commit_ts
    assert before_alters is not None
    [old_file] = env.live_paths(table)
    location = env.location(table)
    physical = {f.name: str(f.type) for f in pq.read_schema(absolute(location, old_file))}
    assert physical["t2s"] == "int8" and physical["dec_i64"] == "decimal128(5, 2)"

    # One ALTER per widening (run together): each publishes exactly one version, no job.
    results = env.ddl(
        *(f"ALTER TABLE {table} ALTER COLUMN {name} TYPE {new}" for name, _, new, _ in WIDENINGS)
    )
    assert all("job_id" not in r for r in results), results
    assert sorted(int(r["version"]) for r in results) == list(range(2, 2 + len(WIDENINGS)))
    assert len(env.client.history(table)["versions"]) == 1 + len(WIDENINGS)
    assert env.client.job_list(table, all=True)["jobs"] == []
    described = {c["name"]: c["type"] for c in env.client.describe(table)["schema"]["columns"]}
    assert {name: described[name] for name, _, _, _ in WIDENINGS} == {
        name: new for name, _, new, _ in WIDENINGS
    }

    # A new file with the wide types next to the old one (not rewritten).
    wide_row = (
        2,
        32767,
        2**31 - 1,
        2**40,
        2**31 - 1,
        2**40,
        2**40,
        1e300,
        dt.datetime(2026, 1, 1, 12, 30),
        Decimal("9999999.99"),
        Decimal("9999999999999.99"),
        Decimal("9" * 28 + ".99"),
        Decimal("9" * 36 + ".99"),
        "abcdefghij",
        "a long string",
    )
    wide_schema = "id INT, " + ", ".join(
        f"{name} {'STRING' if new.startswith('VARCHAR') else new}" for name, _, new, _ in WIDENINGS
    )
    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame([wide_row], wide_schema))
    assert old_file in env.live_paths(table)

    expected = sorted([(r[0], *(_widened(v) for v in r[1:])) for r in old_rows] + [wide_row])
    assert rows_of(bridge.read_table(table)) == expected  # the vectorized Parquet reader
    key = "spark.sql.parquet.enableVectorizedReader"
    previous = str(spark.conf.get(key))
    spark.conf.set(key, "false")  # parquet-mr's row reader
    try:
        assert rows_of(bridge.read_table(table)) == expected
    finally:
        spark.conf.set(key, previous)
    source = spark.read.format("metastore").option("table", table).load()  # pyarrow, per file
    assert rows_of(source) == expected
    # AS OF before the ALTERs: the old file alone, with the narrow types.
    then = bridge.read_table(table, as_of=before_alters)
    narrow = {f.name: f.dataType.simpleString() for f in then.schema}
    assert (narrow["t2s"], narrow["d2t"], narrow["dec_i64"]) == ("tinyint", "date", "decimal(5,2)")
    assert rows_of(then) == sorted(old_rows)
