"""A bridge batch that wrote files but never committed them (its body raised, or its commit was
refused) removes its own attempt directories when it ends, as Spark's commit protocol removes a
failed job's output. They lie under the bridge's session (`_txn/<session id>--...`), which GC's
orphan scan leaves alone while that session lives: a driver running for weeks (a streaming
query whose micro-batches are re-planned after each retryable refusal) kept every abandoned
attempt's files until it ended. A commit whose outcome is unknown keeps its files (it may have
committed them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metastore.errors import ReadConflictError
from spark_bridge.bridge import BatchError
from tests.spark.support import SparkEnv, committed_txns, write_attempt

pytestmark = pytest.mark.slow

SRC = "abandon.src"
DST = "abandon.dst"


def _attempt_dirs(env: SparkEnv, table: str) -> set[str]:
    txn = Path(env.location(table)) / "_txn"
    return set(os.listdir(txn)) if txn.is_dir() else set()


def test_a_batch_that_never_commits_removes_its_attempt_directories(spark_env: SparkEnv) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS abandon")
    env.ddl(f"CREATE TABLE {SRC} (id BIGINT)", f"CREATE TABLE {DST} (id BIGINT)")
    bridge = env.bridge(app_name="abandoned")
    df = env.spark.createDataFrame([(1,), (2,)], "id BIGINT")
    with bridge.batch(writes=[DST]) as first:
        first.write(DST, df)
    kept = _attempt_dirs(env, DST)
    assert len(kept) == 1  # a committed batch's directory stays: its files are the table's

    # The body raises after a write: nothing was sent, the directory goes.
    with (  # noqa: PT012 - the batch body runs inside pytest.raises
        pytest.raises(RuntimeError, match="body failed"),
        bridge.batch(writes=[DST]) as b,
    ):
        b.write(DST, df)
        assert len(_attempt_dirs(env, DST)) == 2
        raise RuntimeError("body failed")
    assert _attempt_dirs(env, DST) == kept

    # The commit is refused (a read conflict: nothing committed), the directory goes too.
    with (  # noqa: PT012 - the batch body runs inside pytest.raises; its commit raises
        pytest.raises(BatchError) as info,
        bridge.batch(reads=[SRC], writes=[DST], check_reads=True) as b,
    ):
        b.read(SRC).count()
        b.write(DST, df)
        write, _ = write_attempt(env.client, SRC, "other:abandon", [{"id": 4}])
        env.client.commit("other:abandon", [write])
    assert isinstance(info.value.cause, ReadConflictError)
    assert not any(c["txn_id"] == b.txn_id for c in committed_txns(env.client))
    assert _attempt_dirs(env, DST) == kept
    assert sorted(r.id for r in bridge.read_table(DST).collect()) == [1, 2]
