"""Structured Streaming through `foreach_batch`: a DDL during the stream takes effect at the first
micro-batch with Top >= Tu (no restart), every two-table micro-batch is visible in both tables or
neither at every timestamp, and a replayed micro-batch commits once - whether replayed by hand or
by Spark after a restart from the checkpoint.

The module runs one stream twice (`runs`): run 1 writes events + per-batch totals while an
`ALTER TABLE ... ADD COLUMN` activates; after it stops, the checkpoint's record of its last
completed batch is removed, as if the driver had died after the metastore commit but before
Spark's own commit log write, and run 2 restarts from the same checkpoint."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spark_bridge.bridge import BatchContext, BatchReport, MetastoreBridge
from tests.spark.support import SparkEnv, committed_txns, only, rows_of, wait_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

pytestmark = pytest.mark.slow

EVENTS = "st.events"
TOTALS = "st.totals"
REPLAY = "st.replay"
QUERY = "events-stream"
TRIGGER = "1 second"
ROWS_PER_SECOND = 8
BATCHES_BEFORE_ALTER = 2
BATCHES_AFTER_TU = 2
BATCHES_AFTER_RESTART = 2
STOP_GAP_WAIT_S = 30.0


def _batch_id(b: BatchContext) -> int:
    # foreach_batch's txn id is "<query_name>:<query.id>:<batch_id>".
    return int(b.txn_id.rsplit(":", 1)[1])


def body(b: BatchContext, df: DataFrame) -> None:
    from pyspark.sql import functions as F

    batch = _batch_id(b)
    events = df.select(F.col("value").alias("id"), F.lit(batch).cast("bigint").alias("batch"))
    if "channel" in b.schema(EVENTS).fieldNames():
        # The pinned schema has the new column, so this batch's Top is >= its Tu.
        events = events.withColumn("channel", F.lit(f"c{batch}"))
    b.write(EVENTS, events)
    totals = events.agg(F.count("*").alias("n")).select(
        F.lit(batch).cast("bigint").alias("batch"), "n"
    )
    b.write(TOTALS, totals)


@dataclass
class Run:
    reports: list[BatchReport] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_batch(self, report: BatchReport) -> None:
        with self.lock:
            self.reports.append(report)


@dataclass
class Runs:
    first: Run
    second: Run
    tu: int
    old_version: int
    new_version: int
    replayed_batch: int
    first_run_committed: dict[str, Any]  # txn_log record of the replayed batch id, from run 1


def _start(bridge: MetastoreBridge, run: Run, checkpoint: Path) -> StreamingQuery:
    fn = bridge.foreach_batch(
        body, query_name=QUERY, writes=[EVENTS, TOTALS], on_batch=run.on_batch
    )
    return (
        bridge.spark.readStream.format("rate")
        .option("rowsPerSecond", ROWS_PER_SECOND)
        .load()
        .writeStream.queryName(QUERY)
        .foreachBatch(fn)
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _wait_reports(stream: StreamingQuery, run: Run, pred: Any, what: str) -> None:
    def ready() -> bool:
        if stream.exception() is not None:
            raise AssertionError(f"the streaming query failed: {stream.exception()}")
        with run.lock:
            return bool(pred(list(run.reports)))

    wait_until(ready, timeout_s=60, what=what)


def _stop(stream: StreamingQuery) -> None:
    # Between triggers if possible, so the last batch is complete in the checkpoint too (a stop
    # that interrupts a batch is handled by the fixture as well, only less deterministically).
    # Only if possible: on a loaded machine a batch can take longer than the trigger interval,
    # and Spark then starts the next one at once, so a gap may never be seen.
    deadline = time.monotonic() + STOP_GAP_WAIT_S
    while stream.isActive and time.monotonic() < deadline:
        if stream.exception() is not None or not stream.status["isTriggerActive"]:
            break
        time.sleep(0.02)
    stream.stop()
    stream.awaitTermination(30)
    assert not stream.isActive


def _forget_batch(checkpoint: Path, log_name: str, batch: int) -> None:
    (checkpoint / log_name / str(batch)).unlink()
    (checkpoint / log_name / f".{batch}.crc").unlink(missing_ok=True)


def _batch_ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def runs(spark_env: SparkEnv, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    env = spark_env
    env.ddl("CREATE NAMESPACE st")
    env.ddl(
        f"CREATE TABLE {EVENTS} (id BIGINT NOT NULL, batch BIGINT)",
        f"CREATE TABLE {TOTALS} (batch BIGINT, n BIGINT)",
    )
    checkpoint = tmp_path_factory.mktemp("checkpoint")
    bridge = env.bridge(app_name="stream")
    old_version = int(env.client.schema_at(EVENTS)["version"])

    first = Run()
    stream = _start(bridge, first, checkpoint)
    query_id = stream.id
    try:
        _wait_reports(stream, first, lambda r: len(r) >= BATCHES_BEFORE_ALTER, "first batches")
        alter = env.client.ddl(f"ALTER TABLE {EVENTS} ADD COLUMN channel STRING")
        tu = int(alter["tu"])
        _wait_reports(
            stream,
            first,
            lambda r: sum(x.top >= tu for x in r) >= BATCHES_AFTER_TU,
            "micro-batches planned after Tu",
        )
        assert stream.isActive and stream.id == query_id  # the same query, never restarted
    finally:
        _stop(stream)

    # Make Spark replay the last batch that committed in the metastore, as if the driver died
    # right after that commit and before Spark recorded the batch: drop it (and anything after
    # it, e.g. a batch the stop interrupted) from the checkpoint's offset and commit logs' tails.
    record = {
        int(c["txn_id"].rsplit(":", 1)[1]): c for c in committed_txns(env.client, f"{QUERY}:")
    }
    offsets = _batch_ids(checkpoint / "offsets")
    while offsets and offsets[-1] not in record:
        _forget_batch(checkpoint, "offsets", offsets.pop())
    assert offsets, "the first run committed no micro-batch"
    replayed = offsets[-1]
    for batch in _batch_ids(checkpoint / "commits"):
        if batch >= replayed:
            _forget_batch(checkpoint, "commits", batch)
    first_run_committed = record[replayed]

    second = Run()
    stream = _start(bridge, second, checkpoint)
    try:
        _wait_reports(
            stream, second, lambda r: len(r) >= 1 + BATCHES_AFTER_RESTART, "batches after restart"
        )
    finally:
        _stop(stream)
    return Runs(
        first=first,
        second=second,
        tu=tu,
        old_version=old_version,
        new_version=int(alter["version"]),
        replayed_batch=replayed,
        first_run_committed=first_run_committed,
    )


def test_ddl_takes_effect_at_the_first_micro_batch_with_top_at_or_after_tu(
    runs: Runs, spark_env: SparkEnv
) -> None:
    reports = runs.first.reports
    before = [r for r in reports if r.top < runs.tu]
    after = [r for r in reports if r.top >= runs.tu]
    assert len(before) >= BATCHES_BEFORE_ALTER and len(after) >= BATCHES_AFTER_TU
    for r in reports:
        want = runs.old_version if r.top < runs.tu else runs.new_version
        assert r.pinned == {EVENTS: want, TOTALS: 1}, r.line()
        assert r.commit_ts is not None and r.commit_ts > r.top, r.line()
    # Batches are planned in order, so the switch happens once, at the first Top >= Tu.
    switched = [r.pinned[EVENTS] == runs.new_version for r in reports]
    assert switched == sorted(switched)

    # The new column is in the data of exactly those batches (read with the current schema).
    last = max(r.commit_ts or 0 for r in runs.second.reports)
    current = spark_env.bridge().read_table(EVENTS, as_of=last)
    assert "channel" in current.columns
    with_channel = {b for b, c in rows_of(current, "batch", "channel") if c is not None}
    late = {int(r.txn_id.rsplit(":", 1)[1]) for r in after}
    late |= {int(r.txn_id.rsplit(":", 1)[1]) for r in runs.second.reports}
    assert with_channel == late
    # ... and its value is the one that batch wrote.
    for b, c in rows_of(current, "batch", "channel"):
        assert c is None or c == f"c{b}"


def test_two_table_batches_are_atomic_at_every_timestamp(runs: Runs, spark_env: SparkEnv) -> None:
    from pyspark.sql import functions as F

    env = spark_env
    bridge = env.bridge()
    commits = committed_txns(env.client, f"{QUERY}:")
    assert len(commits) >= BATCHES_BEFORE_ALTER + BATCHES_AFTER_TU + BATCHES_AFTER_RESTART
    for c in commits:
        assert c["tables"] == sorted([EVENTS, TOTALS]), c
    stamps = sorted({t for c in commits for t in (c["ts"] - 1, c["ts"])})
    # One Spark job per table for all timestamps: tag each AS OF read with its timestamp.
    events = None
    totals = None
    for t in stamps:
        e = bridge.read_table(EVENTS, as_of=t).select(F.lit(t).alias("t"), "id")
        s = bridge.read_table(TOTALS, as_of=t).select(F.lit(t).alias("t"), "n")
        events = e if events is None else events.unionByName(e)
        totals = s if totals is None else totals.unionByName(s)
    assert events is not None and totals is not None
    count = dict(rows_of(events.groupBy("t").count()))
    summed = dict(rows_of(totals.groupBy("t").agg(F.sum("n"))))
    expected = 0
    for c in commits:
        # Just below the commit: neither table shows it; at it: both do.
        assert count.get(c["ts"] - 1, 0) == (summed.get(c["ts"] - 1) or 0) == expected, c
        expected += c["rows_added"] - 1  # the totals row is one of the rows it added
        assert count.get(c["ts"], 0) == summed.get(c["ts"]) == expected, c


def test_restart_from_checkpoint_replays_the_last_batch_once(
    runs: Runs, spark_env: SparkEnv
) -> None:
    env = spark_env
    replay = runs.second.reports[0]
    # Same query (same checkpoint, so the same query.id) and the same batch id as run 1's.
    assert replay.txn_id.startswith(f"{QUERY}:") and replay.txn_id.endswith(
        f":{runs.replayed_batch}"
    )
    assert replay.txn_id.rsplit(":", 1)[0] == runs.first.reports[0].txn_id.rsplit(":", 1)[0]
    # It committed in run 1 (the fixture makes sure): the replay commits nothing new.
    assert replay.deduplicated, replay.line()
    assert replay.commit_ts == runs.first_run_committed["ts"]
    commits = committed_txns(env.client, f"{QUERY}:")
    ids = [c["txn_id"] for c in commits]
    assert len(ids) == len(set(ids))
    batches = sorted(int(t.rsplit(":", 1)[1]) for t in ids)
    assert batches == list(range(len(batches))), "every micro-batch committed exactly once"
    last = max(c["ts"] for c in commits)
    events = env.bridge().read_table(EVENTS, as_of=last)
    rows = rows_of(events, "id", "batch")
    ids_seen = [i for i, _ in rows]
    assert len(ids_seen) == len(set(ids_seen)), "a replayed micro-batch duplicated rows"
    # The rate source numbers rows 0, 1, 2, ...: nothing lost across the restart either.
    assert sorted(ids_seen) == list(range(len(ids_seen)))
    per_batch = dict(rows_of(env.bridge().read_table(TOTALS, as_of=last), "batch", "n"))
    assert sorted(per_batch) == batches
    assert sum(per_batch.values()) == len(ids_seen)


def test_foreach_batch_called_twice_with_the_same_batch_commits_once(spark_env: SparkEnv) -> None:
    from pyspark.sql import functions as F

    env = spark_env
    env.ddl(f"CREATE TABLE {REPLAY} (id BIGINT)")
    reports: list[BatchReport] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        b.write(REPLAY, df.select(F.col("value").alias("id")))

    fn = env.bridge().foreach_batch(
        write, query_name="by-hand", writes=[REPLAY], on_batch=reports.append
    )
    df = env.spark.range(5).select(F.col("id").alias("value"))
    sc = env.spark.sparkContext
    # What Structured Streaming sets around foreachBatch; here the test plays the query.
    sc.setLocalProperty("sql.streaming.queryId", "by-hand-query")
    try:
        fn(df, 7)
        fn(df, 7)
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    first, second = reports
    assert not first.deduplicated and second.deduplicated
    assert first.commit_ts == second.commit_ts
    record = only(committed_txns(env.client, "by-hand:"))
    assert record["txn_id"] == "by-hand:by-hand-query:7" and record["ts"] == first.commit_ts
    assert rows_of(env.bridge().read_table(REPLAY, as_of=first.commit_ts)) == [
        (i,) for i in range(5)
    ]
    # The replay wrote its own files; no commit references them (they are left for GC).
    live = env.live_paths(REPLAY, as_of=first.commit_ts)
    location = Path(env.location(REPLAY))
    written = {
        str(p.relative_to(location))
        for p in location.glob("_txn/*by-hand_by-hand-query_7-*/*.parquet")
    }
    assert live < written


def test_a_replay_past_the_txn_id_window_is_caught_by_the_stream_mark(spark_env: SparkEnv) -> None:
    """Txn ids are remembered for the newest 100k commits only; a micro-batch replayed later
    used to commit twice. Its stream position (query, batch id) now stops it however old it is.
    The daemons cannot be pushed past 100k commits in a test, so the replay here carries a txn
    id the log never saw - exactly what a forgotten one looks like - with the same position."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.marks"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    stream = "marks:marks-query"
    df = env.spark.range(3)
    bridge = env.bridge(app_name="marks")
    with bridge.batch(writes=[table], txn_id=f"{stream}:7", stream=(stream, 7)) as b:
        b.write(table, df)
    committed = b.report.commit_ts
    assert committed is not None and not b.report.deduplicated
    # The replay: other files, a txn id nobody remembers, the same (or an earlier) position.
    for seq in (7, 3):
        with bridge.batch(writes=[table], txn_id=f"forgotten:{seq}", stream=(stream, seq)) as r:
            r.write(table, df)
        assert r.report.deduplicated and r.report.commit_ts == committed, r.report.line()
    assert rows_of(env.bridge().read_table(table)) == [(0,), (1,), (2,)]
    assert not [c for c in committed_txns(env.client) if c["txn_id"].startswith("forgotten:")]

    # A restarted driver (a new bridge) asked to run an older batch of the query skips it
    # before any work, by the stream's mark, and starts reading at or above its last commit.
    restarted = env.bridge(app_name="marks-restarted")
    reports: list[BatchReport] = []
    bodies: list[int] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        bodies.append(_batch_id(b))
        b.write(table, df.select(F.col("id")))

    fn = restarted.foreach_batch(write, query_name="marks", writes=[table], on_batch=reports.append)
    sc = env.spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", "marks-query")  # as a streaming query does
    try:
        fn(df, 5)  # below the mark (7): already committed, skipped without running the body
        assert restarted.last_commit_ts == committed
        fn(df, 8)  # the next batch commits
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    skipped, ran = reports
    assert skipped.deduplicated and skipped.commit_ts == committed
    assert bodies == [8]
    assert not ran.deduplicated and ran.commit_ts is not None and ran.commit_ts > committed
    assert ran.read_ts >= committed  # read its own (previous driver's) writes
    assert len(rows_of(env.bridge().read_table(table))) == 6


def test_a_fresh_checkpoint_under_the_same_query_name_commits_its_batches(
    spark_env: SparkEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Batch ids restart at 0 with a new checkpoint. When txn ids were "<query_name>:<batch_id>",
    the new query's batches collided with the old query's commits and were reported as
    deduplicated: silently dropped. Now each query's ids embed its query.id."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.fresh"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="fresh")

    def write(b: BatchContext, df: DataFrame) -> None:
        b.write(table, df.select(F.col("value").alias("id")))

    runs = []
    for _ in range(2):  # two queries, same name, each with its own fresh checkpoint
        run = Run()
        fn = bridge.foreach_batch(write, query_name="fresh", writes=[table], on_batch=run.on_batch)
        stream = (
            bridge.spark.readStream.format("rate")
            .option("rowsPerSecond", ROWS_PER_SECOND)
            .load()
            .writeStream.foreachBatch(fn)
            .trigger(processingTime=TRIGGER)
            .option("checkpointLocation", str(tmp_path_factory.mktemp("fresh-checkpoint")))
            .start()
        )
        try:
            _wait_reports(stream, run, lambda r: len(r) >= 2, "two micro-batches")
        finally:
            _stop(stream)
        runs.append(run)
    first, second = (sorted(r.reports, key=_batch_id) for r in runs)
    assert [_batch_id(r) for r in second][:2] == [0, 1]  # the ids really restarted
    for report in second:
        assert not report.deduplicated, report.line()
        assert report.commit_ts is not None
    assert {r.txn_id for r in first}.isdisjoint({r.txn_id for r in second})
    # Every row of both queries is in the table: nothing was dropped as a "duplicate".
    last = max(r.commit_ts or 0 for r in [*first, *second])
    written = sum(r.rows for r in [*first, *second])
    assert len(rows_of(bridge.read_table(table, as_of=last), "id")) == written
