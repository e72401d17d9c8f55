"""Spark reads of a compacted table (metastore.manifests): the bridge compacts a table on its own
once it passes `loose_files_max`, and `bridge.read_table` and `format("metastore")` return the
same rows AS OF every commit as before, whether the manifests are expanded on the driver or by
one Spark task per manifest; a removal of a file in a manifest hides its rows from then on;
an append through the data source compacts as well."""

from __future__ import annotations

from typing import Any

import pytest

import spark_bridge.bridge as bridge_module
import spark_bridge.datasource as datasource_module
from spark_bridge.bridge import MetastoreBridge
from tests.spark.support import SparkEnv, rows_of

pytestmark = pytest.mark.slow

TABLE = "man.t"
BATCHES = 3


def _append(bridge: MetastoreBridge, first_id: int) -> int:
    with bridge.batch(writes=[TABLE]) as b:
        df = bridge.spark.createDataFrame(
            [(first_id + i, f"r{first_id + i}") for i in range(4)], "id BIGINT, name STRING"
        ).repartition(2)
        b.write(TABLE, df)
    assert b.report.commit_ts is not None
    return b.report.commit_ts


def _rows(env: SparkEnv, bridge: MetastoreBridge, ts: int) -> tuple[Any, Any]:
    via_bridge = rows_of(bridge.read_table(TABLE, as_of=ts))
    via_source = rows_of(
        env.spark.read.format("metastore").option("table", TABLE).option("as_of", str(ts)).load()
    )
    return via_bridge, via_source


def test_a_compacted_table_reads_the_same_rows_at_every_timestamp(
    spark_env: SparkEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE man")
    env.ddl(f"CREATE TABLE {TABLE} (id BIGINT, name STRING)")
    bridge = env.bridge(app_name="manifests")
    bridge.loose_files_max = 0  # no automatic compaction while the history is written
    stamps = [_append(bridge, 10 * n) for n in range(BATCHES)]
    before = {ts: _rows(env, bridge, ts) for ts in stamps}
    for via_bridge, via_source in before.values():
        assert via_bridge == via_source
    assert len(before[stamps[-1]][0]) == 4 * BATCHES

    # Past the bound: the next commit compacts the table.
    bridge.loose_files_max = 3
    stamps.append(_append(bridge, 1000))
    assert bridge.compactions == 1
    view = env.client.call("compaction_view", {"table": TABLE})
    assert view["manifests"] and view["total_loose"] == 0
    before[stamps[-1]] = _rows(env, bridge, stamps[-1])
    assert len(before[stamps[-1]][0]) == 4 * (BATCHES + 1)
    for ts, rows in before.items():
        assert _rows(env, bridge, ts) == rows, ts  # manifests expanded on the driver
    # A batch lists its reads with one `files_multi`, which carries the manifests too.
    with bridge.batch(reads=[TABLE], txn_id="read-compacted") as b:
        assert rows_of(b.read(TABLE)) == before[stamps[-1]][0]

    # Many manifests: one Spark task per manifest (the bound is lowered to make "many").
    monkeypatch.setattr(bridge_module, "EXECUTOR_EXPAND_MANIFESTS_MIN", 1)
    monkeypatch.setattr(datasource_module, "EXECUTOR_EXPAND_MANIFESTS_MIN", 1)
    for ts, rows in before.items():
        assert _rows(env, bridge, ts) == rows, ts

    # Remove one file that now sits in a manifest: its rows go from that commit on.
    location, files = _files_now(bridge)
    victim = files[0]["path"]
    with bridge.batch(writes=[TABLE]) as b:
        b.remove(TABLE, [victim])
    removed_ts = b.report.commit_ts
    assert removed_ts is not None
    after = _rows(env, bridge, removed_ts)
    assert after[0] == after[1]
    assert len(after[0]) == 4 * (BATCHES + 1) - files[0]["row_count"]
    for ts, rows in before.items():
        assert _rows(env, bridge, ts) == rows, ts
    assert location

    # An append through format("metastore") past its bound compacts too (folding the delete).
    extra = env.spark.createDataFrame([(5000, "x"), (5001, "y")], "id BIGINT, name STRING")
    extra.write.format("metastore").option("table", TABLE).option("loose_files_max", "1").mode(
        "append"
    ).save()
    view = env.client.call("compaction_view", {"table": TABLE})
    assert view["total_loose"] == 0 and view["total_deletes"] == 0
    latest = env.client.files(TABLE)["as_of"]
    got = _rows(env, bridge, latest)
    assert got[0] == got[1] == sorted([*after[0], (5000, "x"), (5001, "y")])


def _files_now(bridge: MetastoreBridge) -> tuple[str, list[dict[str, Any]]]:
    with bridge.batch(reads=[TABLE], txn_id="list-files") as b:
        return b.files(TABLE)
