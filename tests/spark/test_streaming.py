"""Structured Streaming through `foreach_batch`: a DDL during the stream takes effect at the first
micro-batch with Top >= Tu (no restart), every two-table micro-batch is visible in both tables or
neither at every timestamp, and a replayed micro-batch commits once - whether replayed by hand or
by Spark after a restart from the checkpoint.

The module runs one stream twice (`runs`): run 1 writes events + per-batch totals while an
`ALTER TABLE ... ADD COLUMN` activates; after it stops, the checkpoint's record of its last
completed batch is removed, as if the driver had died after the metastore commit but before
Spark's own commit log write, and run 2 restarts from the same checkpoint."""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spark_bridge.bridge import BatchContext, BatchError, BatchReport, MetastoreBridge
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


def _committed_by_batch(env: SparkEnv, txn_prefix: str) -> dict[int, dict[str, Any]]:
    """The remembered commits whose txn id starts with `txn_prefix`, by batch id."""
    return {int(c["txn_id"].rsplit(":", 1)[1]): c for c in committed_txns(env.client, txn_prefix)}


def _replay_last_committed(checkpoint: Path, committed: dict[int, dict[str, Any]]) -> int:
    """Make Spark replay the last batch that committed in the metastore, as if the driver died
    right after that commit and before Spark recorded the batch: drop it (and anything after
    it, e.g. a batch the stop interrupted) from the checkpoint's offset and commit logs' tails.
    Returns the batch id Spark replays at its next start."""
    offsets = _batch_ids(checkpoint / "offsets")
    while offsets and offsets[-1] not in committed:
        _forget_batch(checkpoint, "offsets", offsets.pop())
    assert offsets, "the first run committed no micro-batch"
    replayed = offsets[-1]
    for batch in _batch_ids(checkpoint / "commits"):
        if batch >= replayed:
            _forget_batch(checkpoint, "commits", batch)
    return replayed


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

    record = _committed_by_batch(env, f"{QUERY}:")
    replayed = _replay_last_committed(checkpoint, record)
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
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")  # also when run without the `runs` fixture
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
    # The replay wrote its own files (this driver ran the query: no lookup before the body);
    # once the mark refused them they were deleted, not left beside the committed ones.
    live = env.live_paths(REPLAY, as_of=first.commit_ts)
    written = _batch_files(Path(env.location(REPLAY)), "by-hand", "by-hand-query", 7)
    assert live == written


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

    # A restarted driver (a new bridge) asked to replay the query's last committed batch skips
    # it before any work, by the stream's mark, and starts reading at or above its last commit.
    # The mark was stored under "<query_name>:<query.id>", as bridges before the stream key was
    # the query id alone stored it: it still counts (same query name as then).
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
        fn(df, 7)  # the mark: already committed, skipped without running the body
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

    # Renamed and restarted again: the query id alone names the stream, so the replay of 8 is
    # found committed (by the mark 8 left) under the new name too, and 7 is still refused.
    renamed: list[BatchReport] = []
    fn = env.bridge(app_name="marks-renamed").foreach_batch(
        write, query_name="marks-renamed", writes=[table], on_batch=renamed.append
    )
    sc.setLocalProperty("sql.streaming.queryId", "marks-query")
    try:
        fn(df, 8)
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    assert [(r.deduplicated, r.commit_ts) for r in renamed] == [(True, ran.commit_ts)]
    assert bodies == [8]
    assert len(rows_of(env.bridge().read_table(table))) == 6


def test_a_batch_id_below_the_committed_one_fails_as_a_rewound_checkpoint(
    spark_env: SparkEnv,
) -> None:
    """Spark replays only the batch after the last one in its commit log, so a batch id below
    the stream's committed one means the checkpoint went backwards (reset with its `metadata`
    kept, or restored from an older copy): Spark numbers new data with ids that already
    committed. Such a batch used to be reported "deduplicated" and skipped, its rows dropped
    without an error; now it fails, non-retryable, both as a restarted driver's first batch
    and mid-run (a batch whose commit the mark refuses). `on_rewind="skip"` skips through the
    committed batch id instead."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.rewound"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    location = Path(env.location(table))
    reports: list[BatchReport] = []
    bodies: list[int] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        bodies.append(_batch_id(b))
        b.write(table, df.select((F.col("id") + 10 * _batch_id(b)).alias("id")))

    df = env.spark.range(3)
    sc = env.spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", "rewound-query")  # as a streaming query does
    try:
        fn = env.bridge(app_name="rewound").foreach_batch(
            write, query_name="rewound", writes=[table], on_batch=reports.append
        )
        fn(df, 4)  # commits position 4
        with pytest.raises(BatchError) as mid_run:
            fn(df, 2)  # mid-run: the mark refuses the commit, and 2 is no replay of 4
        # The body ran (this driver ran the query: no lookup first); its files were deleted.
        assert _batch_files(location, "rewound", "rewound-query", 2) == set()
        restarted = env.bridge(app_name="rewound-restarted")
        fn = restarted.foreach_batch(
            write, query_name="rewound", writes=[table], on_batch=reports.append
        )
        with pytest.raises(BatchError) as at_restart:
            fn(df, 0)  # a restarted driver's first batch: refused before any work
        assert bodies == [4, 2]
        # The user restores an older copy of the checkpoint and wants its batches skipped.
        fn = restarted.foreach_batch(
            write,
            query_name="rewound",
            writes=[table],
            on_batch=reports.append,
            on_rewind="skip",
        )
        for batch in (1, 3, 4, 5):
            fn(df, batch)
        # Mid-run with the opt-in (this driver ran the query, so no lookup first): the body
        # runs, the mark refuses the commit, and the batch is skipped.
        fn = restarted.foreach_batch(
            write,
            query_name="rewound",
            writes=[table],
            on_batch=reports.append,
            on_rewind="skip",
        )
        fn(df, 2)
        with pytest.raises(BatchError, match="on_rewind"):
            restarted.foreach_batch(write, query_name="rewound", writes=[table], on_rewind="ok")
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    from spark_bridge.bridge import CheckpointRewoundError

    for raised, batch in ((mid_run.value, 2), (at_restart.value, 0)):
        assert isinstance(raised, CheckpointRewoundError), raised
        assert not raised.retryable
        assert (raised.batch_id, raised.committed_seq) == (batch, 4)
        text = str(raised)
        assert "checkpoint" in text and "on_rewind" in text and "fresh checkpoint" in text
    assert bodies == [4, 2, 5, 2]  # batches skipped at the lookup run no body
    committed, skipped_1, skipped_3, skipped_4, ran, skipped_mid_run = reports
    assert not committed.deduplicated and committed.commit_ts is not None
    for skipped in (skipped_1, skipped_3, skipped_4):
        assert skipped.skipped_rewind_mark == 4 and not skipped.deduplicated, skipped.line()
        assert skipped.commit_ts is None
    assert not ran.deduplicated and ran.commit_ts is not None and ran.skipped_rewind_mark is None
    assert skipped_mid_run.skipped_rewind_mark == 5 and skipped_mid_run.commit_ts is None
    ids = rows_of(env.bridge().read_table(table))
    assert ids == [(i,) for i in (40, 41, 42, 50, 51, 52)]  # batches 4 and 5 only
    assert _batch_files(location, "rewound", "rewound-query", 2) == set()  # skipped mid-run


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


def _start_query(
    bridge: MetastoreBridge, fn: Any, checkpoint: Path, *, name: str | None = None
) -> StreamingQuery:
    writer = (
        bridge.spark.readStream.format("rate")
        .option("rowsPerSecond", ROWS_PER_SECOND)
        .load()
        .writeStream.foreachBatch(fn)
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(checkpoint))
    )
    return (writer.queryName(name) if name else writer).start()


def test_a_reset_checkpoint_that_kept_its_metadata_fails_the_query_loudly(
    spark_env: SparkEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A checkpoint reset by deleting its offsets and commits but keeping `metadata` restarts
    the same query (same query.id) from batch 0. Its new rows used to be skipped as
    "deduplicated" (the batch ids had committed before), lost without an error; now the
    query fails with a non-retryable CheckpointRewoundError, and `on_rewind="skip"` skips
    through the committed batch id and commits from the next one on."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.reset"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="reset")
    checkpoint = tmp_path_factory.mktemp("reset-checkpoint")
    errors: list[BatchError] = []
    bodies: list[int] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        bodies.append(_batch_id(b))
        b.write(table, df.select(F.col("value").alias("id")))

    def start(run: Run, **options: Any) -> StreamingQuery:
        fn = bridge.foreach_batch(
            write, query_name="reset", writes=[table], on_batch=run.on_batch, **options
        )

        def recording(df: DataFrame, batch_id: int) -> None:
            try:
                fn(df, batch_id)
            except BatchError as exc:
                errors.append(exc)
                raise

        return _start_query(bridge, recording, checkpoint)

    first = Run()
    stream = start(first)
    query_id = stream.id
    try:
        _wait_reports(stream, first, lambda r: len(r) >= 3, "three micro-batches")
    finally:
        _stop(stream)
    committed_seq = max(_committed_by_batch(env, "reset:"))
    for entry in checkpoint.iterdir():  # the reset: all but `metadata` (the query id)
        if entry.name != "metadata":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    second = Run()
    stream = start(second)
    try:
        wait_until(
            lambda: errors or len(second.reports) >= 2 or not stream.isActive,
            what="the restarted query's first batches",
        )
    finally:
        stream.stop()  # not _stop: awaitTermination raises the query's failure
    assert not stream.isActive
    assert stream.id == query_id
    assert [r.line() for r in second.reports] == [], "a rewound batch was skipped silently"
    from spark_bridge.bridge import CheckpointRewoundError

    rewound = only(errors)
    assert isinstance(rewound, CheckpointRewoundError) and not rewound.retryable, rewound
    assert (rewound.batch_id, rewound.committed_seq) == (0, committed_seq)
    assert stream.exception() is not None and "CheckpointRewoundError" in str(stream.exception())
    bodies_before = len(bodies)

    third = Run()
    stream = start(third, on_rewind="skip")
    try:
        _wait_reports(
            stream,
            third,
            lambda r: any(x.commit_ts is not None for x in r),
            "the first batch past the committed one",
        )
    finally:
        _stop(stream)
    skipped = [r for r in third.reports if r.commit_ts is None]
    ran = [r for r in third.reports if r.commit_ts is not None]
    assert [_batch_id(r) for r in skipped] == list(range(committed_seq + 1))
    assert all(r.skipped_rewind_mark == committed_seq for r in skipped)
    assert _batch_id(ran[0]) == committed_seq + 1 and not ran[0].deduplicated
    assert min(bodies[bodies_before:]) == committed_seq + 1  # skipped batches ran no body
    by_batch = _committed_by_batch(env, "reset:")
    assert sorted(by_batch) == list(range(len(by_batch)))  # each batch id committed once


def test_a_query_restarted_under_a_new_name_commits_its_replayed_batch_once(
    spark_env: SparkEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The stream position is keyed by the query id alone: when it was
    "<query_name>:<query.id>", a query restarted under a new name (same checkpoint) replayed
    the batch that committed in the metastore but not in Spark's commit log under a new stream
    key and a new txn id, so it committed a second time (its rows twice)."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.renamed"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="rename")
    checkpoint = tmp_path_factory.mktemp("rename-checkpoint")

    def write(b: BatchContext, df: DataFrame) -> None:
        b.write(table, df.select(F.col("value").alias("id")))

    def start(run: Run, name: str) -> StreamingQuery:
        fn = bridge.foreach_batch(write, query_name=name, writes=[table], on_batch=run.on_batch)
        return _start_query(bridge, fn, checkpoint, name=name)

    first = Run()
    stream = start(first, "before-rename")
    try:
        _wait_reports(stream, first, lambda r: len(r) >= 2, "two micro-batches")
    finally:
        _stop(stream)
    committed = _committed_by_batch(env, "before-rename:")
    replayed = _replay_last_committed(checkpoint, committed)

    second = Run()
    stream = start(second, "after-rename")
    try:
        _wait_reports(stream, second, lambda r: len(r) >= 2, "batches after the rename")
    finally:
        _stop(stream)
    replay = second.reports[0]
    assert _batch_id(replay) == replayed
    assert replay.deduplicated and replay.commit_ts == committed[replayed]["ts"], replay.line()
    renamed = _committed_by_batch(env, "after-rename:")
    assert replayed not in renamed and min(renamed) == replayed + 1
    last = max(c["ts"] for c in renamed.values())
    ids = [i for (i,) in rows_of(bridge.read_table(table, as_of=last), "id")]
    assert ids == list(range(len(ids))), "a replayed micro-batch committed twice"


def _batch_files(location: Path, query_name: str, query_id: str, batch: int) -> set[str]:
    """The Parquet files under `location` written for micro-batch `batch` of the query, by any
    attempt (an attempt directory is `_txn/[<session>--]<query_name>_<query.id>_<batch>-<rand>`),
    relative to the location as commits list them."""
    return {
        str(p.relative_to(location))
        for p in location.glob(f"_txn/*{query_name}_{query_id}_{batch}-*/**/*.parquet")
    }


def test_a_query_restarted_in_the_same_driver_skips_its_replay_before_running_the_body(
    spark_env: SparkEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A query stopped and started again in the same driver (same bridge, same checkpoint) is a
    new run of the same query id. Only a driver's first batch of a query id was looked up, so
    the restarted run's first batch ran the body and wrote its Parquet files before the mark
    refused the commit: a replay wrote files no commit references, and a rewound batch did
    too before CheckpointRewoundError. Each run's first batch is now looked up (the run id
    tells runs apart): a replay is skipped and a rewound batch refused without running the
    body."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.restarted"
    name = "restarted"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    bridge = env.bridge(app_name="restarted")
    checkpoint = tmp_path_factory.mktemp("restarted-checkpoint")
    location = Path(env.location(table))
    bodies: list[int] = []
    errors: list[BatchError] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        bodies.append(_batch_id(b))
        b.write(table, df.select(F.col("value").alias("id")))

    def start(run: Run) -> StreamingQuery:
        fn = bridge.foreach_batch(write, query_name=name, writes=[table], on_batch=run.on_batch)

        def recording(df: DataFrame, batch_id: int) -> None:
            try:
                fn(df, batch_id)
            except BatchError as exc:
                errors.append(exc)
                raise

        return _start_query(bridge, recording, checkpoint)

    first = Run()
    stream = start(first)
    query_id = str(stream.id)
    try:
        _wait_reports(stream, first, lambda r: len(r) >= 2, "two micro-batches")
    finally:
        _stop(stream)
    committed = _committed_by_batch(env, f"{name}:")
    replayed = _replay_last_committed(checkpoint, committed)
    replayed_files = _batch_files(location, name, query_id, replayed)
    assert replayed_files, "the first run wrote no files for the batch it committed"

    # The same driver starts the query again: Spark replays the batch that committed.
    second = Run()
    bodies_before = len(bodies)
    stream = start(second)
    try:
        _wait_reports(stream, second, lambda r: len(r) >= 2, "the replay and the next batch")
    finally:
        _stop(stream)
    assert stream.id == query_id
    replay = second.reports[0]
    assert _batch_id(replay) == replayed
    assert replay.deduplicated and replay.commit_ts == committed[replayed]["ts"], replay.line()
    assert replayed not in bodies[bodies_before:], "the replay ran the body"
    # No attempt of the replay left files beside the ones its first run committed.
    assert _batch_files(location, name, query_id, replayed) == replayed_files
    assert replayed_files <= env.live_paths(table)

    # Reset with `metadata` kept, started again in the same driver: batch 0 is below the mark.
    mark = max(_committed_by_batch(env, f"{name}:"))
    first_batch_files = _batch_files(location, name, query_id, 0)
    for entry in checkpoint.iterdir():
        if entry.name != "metadata":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    third = Run()
    bodies_before = len(bodies)
    stream = start(third)
    try:
        wait_until(
            lambda: errors or third.reports or not stream.isActive,
            what="the reset query's first batch",
        )
    finally:
        stream.stop()  # not _stop: awaitTermination raises the query's failure
    from spark_bridge.bridge import CheckpointRewoundError

    rewound = only(errors)
    assert isinstance(rewound, CheckpointRewoundError), rewound
    assert (rewound.batch_id, rewound.committed_seq) == (0, mark)
    assert third.reports == [] and bodies[bodies_before:] == [], "the rewound batch ran the body"
    assert _batch_files(location, name, query_id, 0) == first_batch_files


def test_a_query_upgraded_and_renamed_in_one_restart_finds_its_old_marks(
    spark_env: SparkEnv,
) -> None:
    """Bridges before the stream key was the query id alone stored a query's marks under
    "<query_name>:<query.id>", and only the current name's such key was looked up: a query
    restarted with this bridge under a new name at once found no mark, so its replay committed
    a second time and a rewound batch committed instead of failing. The old name is found
    among the newest commits (their txn ids "<query_name>:<query.id>:<batch>" name it)."""
    from pyspark.sql import functions as F

    env = spark_env
    table = "st.upgraded"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS st")
    env.ddl(f"CREATE TABLE {table} (id BIGINT)")
    df = env.spark.range(3)
    old_stream = "old-name:upgraded-query"  # an older bridge's key for query "old-name"
    old = env.bridge(app_name="upgraded-old")
    for seq in (4, 5):
        with old.batch(writes=[table], txn_id=f"{old_stream}:{seq}", stream=(old_stream, seq)) as b:
            b.write(table, df)
    committed = b.report.commit_ts
    assert committed is not None
    reports: list[BatchReport] = []
    bodies: list[int] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        bodies.append(_batch_id(b))
        b.write(table, df.select(F.col("id")))

    sc = env.spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", "upgraded-query")  # as a streaming query does
    try:
        rewound = env.bridge(app_name="upgraded-rewound").foreach_batch(
            write, query_name="new-name", writes=[table], on_batch=reports.append
        )
        from spark_bridge.bridge import CheckpointRewoundError

        with pytest.raises(CheckpointRewoundError) as raised:
            rewound(df, 3)  # below the old bridge's mark: a rewound checkpoint
        assert (raised.value.batch_id, raised.value.committed_seq) == (3, 5)
        fn = env.bridge(app_name="upgraded-new").foreach_batch(
            write, query_name="new-name", writes=[table], on_batch=reports.append
        )
        fn(df, 5)  # the replay of the old bridge's last batch: skipped, no body
        fn(df, 6)  # the next batch commits
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    assert bodies == [6]
    replay, ran = reports
    assert replay.deduplicated and replay.commit_ts == committed, replay.line()
    assert not ran.deduplicated and ran.commit_ts is not None and ran.commit_ts > committed
    assert len(rows_of(env.bridge().read_table(table))) == 9  # batches 4, 5 and 6, once each
