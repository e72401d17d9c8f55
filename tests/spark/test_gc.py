"""GC with real Spark: a slow `read_table(as_of=T)` under `bridge.protect(T)` keeps every file it
needs while GC runs with a 1 s TTL; without the protection the same read fails with the typed
threshold error before Spark plans anything (in the bridge and in format("metastore")), never
with a missing file. A driver killed with SIGKILL mid-write leaves an attempt directory that GC
keeps while its session lives and deletes once the session is gone and the grace has passed."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from metastore.errors import BeforeGcThresholdError
from tests.daemon.harness import metastore_cluster
from tests.spark.support import SparkEnv, read_line_within, rows_of, start_driver, wait_until

pytestmark = pytest.mark.slow

TABLE = "gcs.events"
GRACE_MS = 2_000
KILLED_TTL_MS = 1_500


@pytest.fixture(scope="module")
def gc_env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    with metastore_cluster(
        tmp_path_factory.mktemp("spark-gc"),
        gc_interval_ms=3_600_000,  # GC runs when the test asks
        gc_orphan_grace_ms=GRACE_MS,
    ) as cluster:
        cluster.start_all()
        cluster.wait_ready()
        env = SparkEnv(cluster, spark)
        env.ddl("CREATE NAMESPACE gcs")
        env.ddl(f"CREATE TABLE {TABLE} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
        try:
            yield env
        finally:
            env.close()


def _files_on_disk(env: SparkEnv, table: str, as_of: int) -> list[Path]:
    location = Path(env.location(table))
    return [location / p for p in env.live_paths(table, as_of=as_of)]


def test_a_protected_slow_read_keeps_its_files_and_an_unprotected_one_gets_the_typed_error(
    gc_env: SparkEnv,
) -> None:
    env = gc_env
    bridge = env.bridge(app_name="gc-reader")
    with bridge.batch(writes=[TABLE]) as b:
        b.write(TABLE, env.spark.createDataFrame([(1,), (2,)], "id BIGINT"))
    t1 = b.report.commit_ts
    assert t1 is not None
    with bridge.batch(writes=[TABLE]) as b:
        b.write(TABLE, env.spark.createDataFrame([(3,)], "id BIGINT"), mode="overwrite")
    needed = _files_on_disk(env, TABLE, t1)
    assert needed and all(p.exists() for p in needed)

    with bridge.protect(t1, tables=[TABLE], meta="slow read") as record:
        df = bridge.read_table(TABLE, as_of=t1)  # planned; Spark reads the files later
        time.sleep(1.5)  # past the 1 s TTL: only the protection keeps t1 readable
        run = env.client.gc_run(TABLE)
        assert run["tables"][0]["held_by"]["record_id"] == record["record_id"]
        assert all(p.exists() for p in needed)
        assert sorted(rows_of(df, "id")) == [(1,), (2,)]  # the slow read's action
    run = env.client.gc_run(TABLE)  # released: the files of t1 go
    assert run["files_deleted"] == len(needed)
    assert not any(p.exists() for p in needed)
    with pytest.raises(BeforeGcThresholdError) as err:
        bridge.read_table(TABLE, as_of=t1)
    assert err.value.details["table"] == TABLE and err.value.details["ts"] == t1
    with pytest.raises(Exception, match="must be after GC threshold"):
        env.spark.read.format("metastore").option("table", TABLE).option("as_of", str(t1)).load()
    assert rows_of(bridge.read_table(TABLE), "id") == [(3,)]


def test_a_killed_drivers_attempt_is_kept_while_its_session_lives_then_collected(
    gc_env: SparkEnv,
) -> None:
    env = gc_env
    proc = start_driver(
        env,
        "tests.spark.driver_until_killed",
        "--txn-id",
        "killed-writer:0",
        "--lease-ttl-ms",
        str(KILLED_TTL_MS),
        TABLE,
    )
    try:
        line = read_line_within(proc, 30.0)
        assert line, f"driver exited early: {proc.wait(10)}"
        written = json.loads(line)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    location = Path(env.location(TABLE))
    committed = [location / p for p in env.live_paths(TABLE)]
    attempt = [location / p for p in written["files"][TABLE]]
    assert attempt and all(p.exists() for p in attempt)
    assert all(written["session_id"] in p.parent.name for p in attempt)
    # Make the files older than the grace: only the live session keeps them now.
    old = time.time() - 60
    for p in attempt:
        os.utime(p, (old, old))
    assert env.client.gc_run(TABLE)["orphans_deleted"] == 0
    assert all(p.exists() for p in attempt)
    wait_until(
        lambda: (
            all(
                s["session_id"] != written["session_id"]
                for s in env.client.session_list()["sessions"]
            )
            or None
        ),
        what="the killed driver's session to expire",
    )
    run = env.client.gc_run(TABLE)
    assert run["orphans_deleted"] >= len(attempt)
    assert not any(p.exists() for p in attempt)
    assert committed and all(p.exists() for p in committed)  # committed files are never orphans
