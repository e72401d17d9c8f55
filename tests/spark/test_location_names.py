"""Table locations named as real users name directories: a space, a literal `%20` or `%`,
non-ASCII letters, a Hive-style `k=1`, given as a plain path or as a `file://` URI.

A `file://` location names the local path written after `file://`, taken literally (as Spark's
writer, Hadoop's `Path`, and the GC take it): `file:///d/a%20b` is the directory `/d/a%20b`,
never `/d/a b`. pyarrow's `FileSystem.from_uri` percent-decodes a URI's path and refuses one
with a space, a lone `%` or non-ASCII text, so a bridge batch into such a table failed after
Spark wrote its files (or committed nothing), and every `format("metastore")` append into any
`file://` location failed in its tasks (`os.makedirs` of the URI text made a `file:` directory
in the worker's working directory). Each table here is written through the bridge and the data
source, read through both and `metastore table read`, optimized and compacted (manifests under
the location), overwritten, and collected: GC deletes exactly the replaced files and an
orphan, and nothing at the percent-decoded path.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from cli.main import cli
from metastore.client.manifest_files import compact_table
from tests.daemon.harness import metastore_cluster
from tests.spark.support import SparkEnv, rows_of

pytestmark = pytest.mark.slow

NS = "locnames"
TTL_S = 1
GRACE_MS = 2_000


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    with metastore_cluster(
        tmp_path_factory.mktemp("spark-locnames"),
        gc_interval_ms=3_600_000,  # GC runs when the test asks
        gc_orphan_grace_ms=GRACE_MS,
    ) as cluster:
        cluster.start_all()
        cluster.wait_ready()
        env = SparkEnv(cluster, spark)
        env.ddl(f"CREATE NAMESPACE {NS}")
        env.bridge()  # registers format("metastore") for this cluster
        try:
            yield env
        finally:
            env.close()


def _files_under(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}


def _cli_rows(env: SparkEnv, table: str) -> list[int]:
    base = ["--endpoints", ",".join(env.endpoints), "--token", env.token, "-o", "json"]
    run = CliRunner().invoke(cli, [*base, "table", "read", table])
    assert run.exit_code == 0, run.output
    return sorted(int(r["id"]) for r in json.loads(run.output)["rows"])


@pytest.mark.parametrize(
    ("index", "name", "scheme"),
    [
        (0, "sp ace", "file://"),
        (1, "pct%20lit", "file://"),
        (2, "pct%lit", "file://"),
        (3, "é日本", "file://"),
        (4, "k=1", "file://"),
        (5, "pct%20lit", ""),
        (6, "sp ace#q?", ""),
        (7, "pct%20lit", "FILE://"),  # a scheme's case does not matter (Hadoop's Path)
    ],
)
def test_a_table_at_a_location_with_such_a_name_is_written_read_and_collected(
    env: SparkEnv, index: int, name: str, scheme: str
) -> None:
    directory = env.warehouse.resolve() / "names" / f"{index}" / name
    # Where a percent-decoding of the location would land: never written to, never deleted.
    decoy = directory.with_name(name.replace("%20", " "))
    if decoy != directory:
        (decoy / "_txn" / "x").mkdir(parents=True)
        (decoy / "_txn" / "x" / "part-0.parquet").write_bytes(b"not ours")
    location = f"{scheme}{directory}/"
    table = f"{NS}.t{index}"
    env.client.ddl(
        f"CREATE TABLE {table} (id BIGINT) LOCATION '{location}' "
        f"TBLPROPERTIES ('gc.ttl' = '{TTL_S}s')"
    )
    assert env.location(table) == f"{scheme.lower()}{directory}"
    spark = env.spark
    bridge = env.bridge(app_name=f"locnames-{index}")

    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame([(1,), (2,)], "id BIGINT").coalesce(1))
    spark.createDataFrame([(3,)], "id BIGINT").coalesce(1).write.format("metastore").option(
        "table", table
    ).mode("append").save()
    assert not Path("file:").exists(), "a file URI was taken for a relative directory"
    assert rows_of(bridge.read_table(table)) == [(1,), (2,), (3,)]
    assert rows_of(spark.read.format("metastore").load(table)) == [(1,), (2,), (3,)]
    assert _cli_rows(env, table) == [1, 2, 3]

    optimized = bridge.optimize(table, target_file_bytes=64 * 1024**2, min_files=2)
    assert optimized.files_rewritten == 2 and optimized.files_written == 1
    assert compact_table(env.client, table)["compacted"]
    assert rows_of(spark.read.format("metastore").load(table)) == [(1,), (2,), (3,)]
    assert _cli_rows(env, table) == [1, 2, 3]

    replaced = env.live_paths(table)
    assert replaced <= _files_under(directory), "a committed file is not where it was written"
    with bridge.batch(writes=[table]) as b:
        b.write(table, spark.createDataFrame([(9,)], "id BIGINT"), mode="overwrite")
    live = env.live_paths(table)
    # An attempt no commit references, of no session, older than the grace: an orphan.
    orphan = directory / "_txn" / "abandoned-0" / "part-0.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"orphan")
    old = time.time() - 60
    os.utime(orphan, (old, old))
    time.sleep(TTL_S + 0.2)  # past the TTL: the replaced files may go
    env.client.gc_run(table)
    on_disk = _files_under(directory)
    assert not replaced & on_disk, "GC left replaced files"
    assert not orphan.exists(), "the orphan scan missed a file"
    assert live <= on_disk, "GC deleted a live file"
    if decoy != directory:
        assert _files_under(decoy) == {"_txn/x/part-0.parquet"}
    assert rows_of(spark.read.format("metastore").load(table)) == [(9,)]
    assert rows_of(bridge.read_table(table)) == [(9,)]
    assert _cli_rows(env, table) == [9]
