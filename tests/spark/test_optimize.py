"""`bridge.optimize` / `metastore table optimize` with real Spark (local[2]) on a real cluster.

* Small files of two schema vintages (before and after ADD COLUMN d INT DEFAULT 5) become one
  file in one commit; the rows are identical before and after, at every earlier timestamp too
  (old rows still read d = 5, now stored), and the rewritten file carries every field id.
* A writer that removes one of the small files while optimize plans its chunk wins: optimize's
  commit is refused whole (DATA_FILE_CONFLICT), the chunk is planned again without that file,
  and no row of either writer is lost or duplicated.
* The CLI: --dry-run says what it would do and changes nothing; bad sizes are usage errors;
  a run prints its result as JSON.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from cli.main import cli
from spark_bridge.bridge import MetastoreBridge
from spark_bridge.files import absolute, top_level_field_ids
from spark_bridge.optimize import OptimizeError
from tests.spark.support import SparkEnv, rows_of

pytestmark = pytest.mark.slow

NS = "opt"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl(f"CREATE NAMESPACE {NS}")
    return spark_env


def _append(bridge: MetastoreBridge, table: str, rows: list[tuple[Any, ...]], ddl: str) -> int:
    with bridge.batch(writes=[table]) as b:
        b.write(table, bridge.spark.createDataFrame(rows, ddl).coalesce(1))
    assert b.report.commit_ts is not None
    return b.report.commit_ts


def _rows(bridge: MetastoreBridge, table: str, as_of: int | None = None) -> list[tuple[Any, ...]]:
    return rows_of(bridge.read_table(table, as_of=as_of))


def _small_table(env: SparkEnv, table: str) -> tuple[MetastoreBridge, list[int]]:
    """Four one-file commits before ADD COLUMN d INT DEFAULT 5 and two after; the commit ts."""
    env.ddl(f"CREATE TABLE {table} (id BIGINT, v STRING)")
    bridge = env.bridge(app_name=f"optimize-{table}")
    stamps = [_append(bridge, table, [(i, f"v{i}")], "id BIGINT, v STRING") for i in range(4)]
    env.ddl(f"ALTER TABLE {table} ADD COLUMN d INT DEFAULT 5")
    stamps += [
        _append(bridge, table, [(i, f"v{i}", i * 10)], "id BIGINT, v STRING, d INT")
        for i in range(4, 6)
    ]
    return bridge, stamps


def test_small_files_become_one_and_every_timestamp_reads_the_same_rows(env: SparkEnv) -> None:
    table = f"{NS}.vintages"
    bridge, stamps = _small_table(env, table)
    before = {ts: _rows(bridge, table, ts) for ts in stamps}
    now_before = _rows(bridge, table)
    assert len(env.live_paths(table)) == 6
    assert (0, "v0", 5) in now_before and (5, "v5", 50) in now_before

    lines: list[str] = []
    result = bridge.optimize(table, target_file_bytes=64 * 1024**2, progress=lines.append)

    assert (result.files_rewritten, result.files_written, result.commits) == (6, 1, 1)
    assert result.rows_rewritten == 6 and result.commit_ts is not None
    assert any("rewriting 6" in line for line in lines), lines
    live = env.live_paths(table)
    assert len(live) == 1
    assert _rows(bridge, table) == now_before
    for ts, rows in before.items():
        assert _rows(bridge, table, ts) == rows, f"AS OF {ts} changed"
    # The new file stores every column, d included for the rows that predate it.
    location = env.location(table)
    (path,) = live
    assert len(top_level_field_ids(location, path)) == 3
    stored = rows_of(env.spark.read.parquet(absolute(location, path)))
    assert (0, "v0", 5) in stored
    # Nothing small is left: a second run does nothing.
    again = bridge.optimize(table, target_file_bytes=64 * 1024**2)
    assert (again.commits, again.files_rewritten, again.files_before) == (0, 0, 1)


def test_a_concurrent_remove_wins_and_the_chunk_is_planned_again(env: SparkEnv) -> None:
    table = f"{NS}.contended"
    bridge, _ = _small_table(env, table)
    other = env.bridge(app_name="optimize-contender")
    victim = sorted(env.live_paths(table))[0]
    removed = False

    def progress(line: str) -> None:
        # Said inside optimize's first batch, after it listed the files and before it commits:
        # another writer removes one of them first.
        nonlocal removed
        if "rewriting" in line and not removed:
            removed = True
            with other.batch(writes=[table]) as b:
                b.remove(table, [victim])

    expected_before = _rows(bridge, table)
    result = bridge.optimize(table, target_file_bytes=64 * 1024**2, progress=progress)

    assert removed
    assert result.attempts == 2 and result.commits == 1
    assert result.files_rewritten == 5, "the removed file was planned again"
    after = _rows(bridge, table)
    assert len(after) == len(expected_before) - 1
    assert set(after) < set(expected_before)
    assert victim not in env.live_paths(table)


def test_bad_settings_are_refused_before_anything_runs(env: SparkEnv) -> None:
    bridge = env.bridge(app_name="optimize-bad")
    with pytest.raises(OptimizeError, match="below the minimum"):
        bridge.optimize(f"{NS}.vintages", target_file_bytes=10)
    with pytest.raises(OptimizeError, match="at most the target"):
        bridge.optimize(f"{NS}.vintages", target_file_bytes=4096, small_file_bytes=8192)
    with pytest.raises(OptimizeError, match="at least 2"):
        bridge.optimize(f"{NS}.vintages", min_files=1)


def test_cli_dry_run_then_run(env: SparkEnv) -> None:
    table = f"{NS}.cli"
    _small_table(env, table)
    base = ["--endpoints", ",".join(env.endpoints), "--token", env.token, "-o", "json"]
    runner = CliRunner()

    dry = runner.invoke(cli, [*base, "table", "optimize", table, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    doc = json.loads(dry.stdout)
    assert doc["dry_run"] is True and doc["small_files"] == 6 and doc["files_rewritten"] == 6
    assert len(env.live_paths(table)) == 6, "a dry run changed the table"

    bad = runner.invoke(cli, [*base, "table", "optimize", table, "--target-file-size", "12XB"])
    assert bad.exit_code == 2 and "is not a size" in bad.output

    run = runner.invoke(cli, [*base, "table", "optimize", table, "--target-file-size", "64MiB"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.stdout)
    assert doc["files_rewritten"] == 6 and doc["files_written"] == 1 and doc["commits"] == 1
    assert len(env.live_paths(table)) == 1


def test_a_small_file_spark_skips_is_not_removed(env: SparkEnv) -> None:
    """A session that skips unreadable files (spark.sql.files.ignoreCorruptFiles, common in
    streaming jobs) read a damaged small file as no rows: optimize wrote the others and removed
    all of them, and the damaged file's rows were gone at every later timestamp. The rows
    written must be the rows the removed files hold, or nothing is committed."""
    table = f"{NS}.damaged"
    env.ddl(f"CREATE TABLE {table} (id BIGINT, v STRING)")
    bridge = env.bridge(app_name=f"optimize-{table}")
    for i in range(3):
        _append(bridge, table, [(i, f"v{i}")], "id BIGINT, v STRING")
    live = sorted(env.live_paths(table))
    damaged = absolute(env.location(table), live[0]).removeprefix("file://")
    with open(damaged, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\0" * 8)  # the footer's length and magic: no longer Parquet
    env.spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    try:
        with pytest.raises(OptimizeError, match="rows"):
            bridge.optimize(table, target_file_bytes=64 * 1024**2)
    finally:
        env.spark.conf.unset("spark.sql.files.ignoreCorruptFiles")
    assert sorted(env.live_paths(table)) == live, "the files were removed anyway"


def test_cli_a_small_file_gone_is_a_typed_spark_failure_not_a_traceback(env: SparkEnv) -> None:
    """A small file missing from storage made Spark's read fail (PATH_NOT_FOUND), and
    `metastore table optimize` ended in a Python traceback. It is now a typed error line and
    exit 1; nothing was committed."""
    import os

    table = f"{NS}.gone"
    env.ddl(f"CREATE TABLE {table} (id BIGINT, v STRING)")
    bridge = env.bridge(app_name=f"optimize-{table}")
    for i in range(3):
        _append(bridge, table, [(i, f"v{i}")], "id BIGINT, v STRING")
    live = sorted(env.live_paths(table))
    os.remove(absolute(env.location(table), live[0]).removeprefix("file://"))
    base = ["--endpoints", ",".join(env.endpoints), "--token", env.token]
    run = CliRunner().invoke(cli, [*base, "table", "optimize", table])
    assert run.exit_code == 1, run.output
    assert "Error: SPARK_FAILED: Spark failed, nothing was committed" in run.output
    assert run.exception is None or isinstance(run.exception, SystemExit)
    assert sorted(env.live_paths(table)) == live


def test_a_table_with_manifests_loose_files_and_pending_deletes_reads_the_same_rows(
    env: SparkEnv,
) -> None:
    """Optimize of a table whose small files sit partly in manifests (one of them removed: a
    delete entry pending) and partly loose: its commit removes files of both kinds (more delete
    entries), and the compaction that follows folds them. Every timestamp reads the same rows
    before the optimize, after it, and after that compaction."""
    from metastore.client.manifest_files import compact_table

    table = f"{NS}.mixed"
    bridge, stamps = _small_table(env, table)
    bridge.loose_files_max = 0  # the compactions here are the test's own
    assert compact_table(env.client, table)["compacted"]  # the six files into a manifest
    victim = sorted(env.live_paths(table))[0]
    with bridge.batch(writes=[table]) as b:
        b.remove(table, [victim])  # a delete entry, pending
    assert b.report.commit_ts is not None
    stamps.append(b.report.commit_ts)
    stamps += [
        _append(bridge, table, [(i, f"v{i}", i)], "id BIGINT, v STRING, d INT") for i in (6, 7)
    ]
    view = env.client.call("compaction_view", {"table": table})
    assert view["manifests"] and view["total_loose"] and view["total_deletes"] == 1
    before = {ts: _rows(bridge, table, ts) for ts in stamps}
    now_before = _rows(bridge, table)
    assert len(now_before) == 7

    result = bridge.optimize(table, target_file_bytes=64 * 1024**2)

    assert (result.files_rewritten, result.files_written, result.commits) == (7, 1, 1)
    assert len(env.live_paths(table)) == 1
    assert _rows(bridge, table) == now_before
    for ts, rows in before.items():
        assert _rows(bridge, table, ts) == rows, f"AS OF {ts} changed"
    assert compact_table(env.client, table)["compacted"]
    view = env.client.call("compaction_view", {"table": table})
    assert view["total_deletes"] == 0
    assert _rows(bridge, table) == now_before
    for ts, rows in before.items():
        assert _rows(bridge, table, ts) == rows, f"AS OF {ts} changed by the compaction"


def test_a_table_with_not_null_nested_fields_and_nested_chars_is_optimized(env: SparkEnv) -> None:
    # Spark reads files with every field nullable, and optimize writes what it read through
    # conform: a NOT NULL nested field (which refused nullable output) made every optimize of
    # such a table fail with SCHEMA_MISMATCH. Nested CHAR values stay padded.
    table = f"{NS}.nested_rules"
    env.ddl(f"CREATE TABLE {table} (id BIGINT, s STRUCT<a: INT NOT NULL, c: CHAR(2)>)")
    bridge = env.bridge(app_name="optimize-nested")
    ddl = "id BIGINT, s STRUCT<a: INT NOT NULL, c: STRING>"
    for i in range(3):
        _append(bridge, table, [(i, (i, "x")), (i + 10, None)], ddl)
    before = sorted((r.id, r.s and tuple(r.s)) for r in bridge.read_table(table).collect())
    assert (0, (0, "x ")) in before and (10, None) in before
    result = bridge.optimize(table, target_file_bytes=64 * 1024**2)
    assert (result.files_rewritten, result.files_written) == (3, 1)
    after = sorted((r.id, r.s and tuple(r.s)) for r in bridge.read_table(table).collect())
    assert after == before
