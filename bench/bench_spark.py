"""Benchmark of the Spark bridge (`make bench-spark`): per-micro-batch overhead, and commits/s.

Usage: `python -m bench.bench_spark [--quick] [--results-dir DIR] [--spark-conf KEY=VALUE ...]`.

Key idea: what the bridge adds to a Structured Streaming micro-batch (pin the schemas at Top,
conform the output, write into a fresh attempt directory, read the footers, one atomic commit) is
measured against the same query writing the same Parquet without it, in one run, on one Spark
session, against one cluster; and the commit path alone is loaded by several writer processes to
see how many commits per second the cluster sustains.

What runs
    Three `python -m metastore.daemon` processes on loopback ports in a temporary directory (fsync
    on, the default DD = CSmax = 500 ms, table data under the cluster's `warehouse`), set up by
    `bench.bench_catalog.Cluster`. Then:
    (a) plain: one local[2] Spark session runs a streaming query (rate source, ROWS_PER_SECOND
        rows/s, 2 partitions, a 1 s processing-time trigger) whose foreachBatch shapes the rows
        (id, ts, amount) and writes them with Spark's Parquet writer into a fresh directory per
        micro-batch (`df.write.mode("errorifexists").parquet(dir)`), exactly the write the
        bridge makes, so the difference is only what the bridge adds;
    (b) bridge: the same query, same session, same rows/s, but foreachBatch is
        `MetastoreBridge.foreach_batch` writing the same DataFrame to a metastore table through
        `BatchContext.write` (pin at Top, conform, write, read the footers, one atomic commit).
        (a) and (b) alternate, `rounds` runs of each (a b a b ...) after one unmeasured warm-up
        run of each (JIT), because a shared machine drifts by more than the effect measured; each
        run is a fresh query whose first `warmup_batches` are dropped (the rate source's first
        batch is empty). A micro-batch's duration is the wall time of the foreachBatch function,
        measured around it on the driver, which is exactly what the bridge can add to; the CPU
        time of Spark's JVM and the driver process over the same interval is recorded too (it
        moves less with the machine's other load). Reported: median and p90 of each kind, the
        ratio bridge / plain of the medians (target <= 1.05) and per round, the difference in
        ms, and the bridge's own pin and commit times from its BatchReport.
    (c) commits/s: Spark is stopped first. `writers` processes (multiprocessing, spawn), each
        with its own `metastore.client.MetastoreClient` (asyncio, pipelined: `pipeline_depth`
        commits in flight on one connection), commit 1-file lists to their own table with
        unique txn ids for `commit_seconds` after a warm-up. Reported: commits/s of all writers
        together (target >= 1000), latency p50/p99, errors, and the CPU each node used.
        Afterwards the files of every writer's table are counted: they must equal the commits
        acknowledged (a benchmark that counted lost or doubled commits would be worse than none).

Results: a table on stdout (targets met / MISSED), JSON in `bench/results/spark-<UTC>.json`,
progress on stderr. Exit status 0 when everything was measured (a missed target is a result).

Invariants: every wait has a deadline; every child process (the nodes, the writers, Spark's JVM)
is started by us and stopped by its PID in a `finally`, on errors, Ctrl-C and SIGTERM alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from bench.bench_catalog import (
    CLUSTER_START_WAIT_S,
    NODE_IDS,
    BenchError,
    Cluster,
    InvalidParamsError,
    LoadProcessError,
    RequestFailedError,
    new_event_loop,
    percentile,
    progress,
)
from bench.machine import machine_info
from bench.procs import PROCESS_EXIT_WAIT_S, sigterm_as_interrupt
from metastore.daemon.api_limits import CLIENT_INFLIGHT_PER_CONNECTION_MAX

RESULTS_DIR: Final = Path(__file__).resolve().parent / "results"
NAMESPACE: Final = "bench"
STREAM_TABLE: Final = f"{NAMESPACE}.events"
COMMIT_TABLE_PREFIX: Final = f"{NAMESPACE}.commits_w"
DD_MS: Final = 500
CS_MAX_MS: Final = 500

# Targets (from the issue). A missed target is reported, not raised.
TARGET_BATCH_RATIO_MAX: Final = 1.05
TARGET_COMMITS_PER_S_MIN: Final = 1000.0

# The streaming workload: the same for (a) and (b).
ROWS_PER_SECOND: Final = 1000
RATE_PARTITIONS: Final = 2
TRIGGER_MS: Final = 1000
SPARK_MASTER: Final = "local[2]"

# Limits of the parameters (each enforced by BenchParams.validate).
ROWS_PER_SECOND_MAX: Final = 1_000_000
BATCHES_MAX: Final = 1000
ROUNDS_MAX: Final = 20
SPARK_CONF_MAX: Final = 32
WRITERS_MAX: Final = 32
# One connection per writer; the client itself never exceeds the server's in-flight limit.
PIPELINE_DEPTH_MAX: Final = CLIENT_INFLIGHT_PER_CONNECTION_MAX
COMMIT_SECONDS_MAX: Final = 600.0
# Latency samples a writer sends back (the rest are only counted): bounds the pipe and memory.
LATENCIES_KEPT_MAX: Final = 200_000

# Bounds on every wait (seconds).
SPARK_START_WAIT_S: Final = 120.0
# A streaming run may take this much longer than its batches x trigger before it is abandoned.
STREAM_GRACE_S: Final = 90.0
STREAM_STOP_WAIT_S: Final = 30.0
JVM_EXIT_WAIT_S: Final = 10.0
WRITER_READY_WAIT_S: Final = 60.0
# A writer reports within its run time plus this (its in-flight commits end within the client
# timeout, which is below it).
WRITER_REPORT_GRACE_S: Final = 30.0
WRITER_START_DELAY_S: Final = 0.5
WRITER_CLIENT_TIMEOUT_MS: Final = 10_000
REQUEST_TIMEOUT_MS: Final = 30_000
POLL_INTERVAL_S: Final = 0.05
TABLE_WIDTH_NON_TTY: Final = 120


class StreamFailedError(BenchError):
    """A streaming query failed or did not make its micro-batches within its bound."""

    code = "stream_failed"


class IntegrityError(BenchError):
    """The files committed do not match the commits acknowledged."""

    code = "integrity"


# --- Parameters and results -------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class BenchParams:
    quick: bool
    rows_per_second: int
    # (a) and (b) run in alternation, `rounds` times each (a b a b ...), after one unmeasured
    # warm-up round; each run is a fresh query whose first `warmup_batches` are dropped.
    rounds: int
    warmup_batches: int
    batches_per_round: int
    writers: int
    pipeline_depth: int
    commit_warmup_seconds: float
    commit_seconds: float
    # Extra Spark session settings (--spark-conf), for experiments; empty for the headline run.
    spark_conf: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_mode(cls, *, quick: bool, spark_conf: tuple[tuple[str, str], ...] = ()) -> BenchParams:
        return cls(
            spark_conf=spark_conf,
            quick=quick,
            rows_per_second=ROWS_PER_SECOND,
            # Short runs, many alternations: other work on a shared machine comes and goes within
            # tens of seconds, and short alternating runs let it hit both kinds alike.
            rounds=3 if quick else 8,
            warmup_batches=2,
            batches_per_round=4 if quick else 5,
            writers=4,
            pipeline_depth=16,
            commit_warmup_seconds=1.0 if quick else 2.0,
            commit_seconds=5.0 if quick else 20.0,
        )

    def validate(self) -> None:
        checks = [
            (1 <= self.rows_per_second <= ROWS_PER_SECOND_MAX, "rows_per_second"),
            (1 <= self.rounds <= ROUNDS_MAX, "rounds"),
            (0 <= self.warmup_batches <= BATCHES_MAX, "warmup_batches"),
            (1 <= self.batches_per_round <= BATCHES_MAX, "batches_per_round"),
            (1 <= self.writers <= WRITERS_MAX, "writers"),
            (1 <= self.pipeline_depth <= PIPELINE_DEPTH_MAX, "pipeline_depth"),
            (0 <= self.commit_warmup_seconds <= COMMIT_SECONDS_MAX, "commit_warmup_seconds"),
            (0 < self.commit_seconds <= COMMIT_SECONDS_MAX, "commit_seconds"),
            (len(self.spark_conf) <= SPARK_CONF_MAX, "spark_conf"),
        ]
        bad = [name for ok, name in checks if not ok]
        if bad:
            raise InvalidParamsError(f"parameters out of their limits: {bad} in {self}")


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "median": None, "p90": None, "p99": None, "min": None, "max": None}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "min": min(values),
        "max": max(values),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSample:
    """One measured micro-batch."""

    round: int
    batch_id: int
    wall_ms: float  # the foreachBatch function, start to end, on the driver
    cpu_ms: float  # CPU of Spark's JVM (driver + local executors) and this process meanwhile
    # Bridge only, from its BatchReport:
    pin_ms: float | None = None
    commit_ms: float | None = None
    files: int | None = None
    rows: int | None = None


@dataclass(slots=True, kw_only=True)
class StreamRun:
    """Every measured micro-batch of one kind (plain or bridge), over all rounds."""

    kind: str
    samples: list[BatchSample] = field(default_factory=list)
    dropped: int = 0  # warm-up batches not measured
    # Per measured run: cores used by everything but Spark's JVM and this process (the nodes,
    # and other work on a shared machine), which explains most of the run-to-run spread.
    others_cores: list[float] = field(default_factory=list)

    def wall_ms(self) -> list[float]:
        return [b.wall_ms for b in self.samples]

    def cpu_ms(self) -> list[float]:
        return [b.cpu_ms for b in self.samples]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "dropped_warmup_batches": self.dropped,
            "others_cores_per_run": [round(c, 3) for c in self.others_cores],
            "batch_ms": summary(self.wall_ms()),
            "batch_cpu_ms": summary(self.cpu_ms()),
            "batches": [asdict(b) for b in self.samples],
        }
        bridge = [b for b in self.samples if b.pin_ms is not None and b.commit_ms is not None]
        if bridge:
            out.update(
                pin_ms=summary([b.pin_ms or 0.0 for b in bridge]),
                commit_ms=summary([b.commit_ms or 0.0 for b in bridge]),
                write_and_rest_ms=summary(
                    [b.wall_ms - (b.pin_ms or 0.0) - (b.commit_ms or 0.0) for b in bridge]
                ),
                files_per_batch=summary([float(b.files or 0) for b in bridge]),
                rows_per_batch=summary([float(b.rows or 0) for b in bridge]),
            )
        return out


@dataclass(slots=True, kw_only=True)
class CommitRun:
    writers: int
    pipeline_depth: int
    window_s: float
    acked_in_window: int
    acked_total: int
    max_commit_ts: int  # of every acknowledged commit: the integrity check reads at it
    errors: dict[str, int]
    latencies_ms: list[float]
    leader: int
    leader_after: int | None  # a different leader means an election happened during (c)
    via: str
    node_cpu_cores: dict[int, float]
    machine_busy_cores: float
    files_committed: int | None
    # The same count at the first node's safe time (the `files` default), for comparison: with
    # no election during (c) that node is the leader, which applied every commit it acknowledged.
    files_at_safe_time: int | None
    commits_per_s: float

    def to_json(self) -> dict[str, Any]:
        doc = {k: v for k, v in asdict(self).items() if k != "latencies_ms"}
        doc["latency_ms"] = summary(self.latencies_ms)
        return doc


@dataclass(slots=True)
class Measurements:
    plain: StreamRun | None = None
    bridge: StreamRun | None = None
    commits: CommitRun | None = None
    notes: list[str] = field(default_factory=list)

    def ratio(self, key: str, *, cpu: bool = False) -> float | None:
        """bridge / plain of a statistic of the per-batch wall (or CPU) times."""
        if self.plain is None or self.bridge is None:
            return None
        if cpu:
            a, b = summary(self.plain.cpu_ms())[key], summary(self.bridge.cpu_ms())[key]
        else:
            a, b = summary(self.plain.wall_ms())[key], summary(self.bridge.wall_ms())[key]
        if not a or b is None:
            return None
        return float(b) / float(a)

    def pin_commit_share(self) -> float | None:
        """(median plain batch + median pin + median commit) / median plain batch: the part of
        the overhead that talks to the metastore, apart from conforming and writing."""
        if self.plain is None or self.bridge is None or not self.plain.samples:
            return None
        pins = [b.pin_ms for b in self.bridge.samples if b.pin_ms is not None]
        commits = [b.commit_ms for b in self.bridge.samples if b.commit_ms is not None]
        if not pins or not commits:
            return None
        plain = statistics.median(self.plain.wall_ms())
        return (plain + statistics.median(pins) + statistics.median(commits)) / plain

    def round_ratios(self) -> list[float]:
        """bridge / plain of the median wall time, per round (the spread shows the noise)."""
        if self.plain is None or self.bridge is None:
            return []
        out = []
        rounds = sorted({b.round for b in self.plain.samples})
        for r in rounds:
            a = [b.wall_ms for b in self.plain.samples if b.round == r]
            b = [x.wall_ms for x in self.bridge.samples if x.round == r]
            if a and b:
                out.append(statistics.median(b) / statistics.median(a))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "plain": self.plain.to_json() if self.plain else None,
            "bridge": self.bridge.to_json() if self.bridge else None,
            "ratio_median": self.ratio("median"),
            "ratio_p90": self.ratio("p90"),
            "ratio_cpu_median": self.ratio("median", cpu=True),
            "pin_commit_share": self.pin_commit_share(),
            "ratio_median_per_round": self.round_ratios(),
            "commits": self.commits.to_json() if self.commits else None,
            "notes": self.notes,
        }


# --- The cluster ------------------------------------------------------------------------------
async def setup_tables(endpoints: list[str], token: str, writers: int) -> None:
    from metastore.client import MetastoreClient

    async with MetastoreClient(endpoints, token, timeout_ms=REQUEST_TIMEOUT_MS) as client:
        await client.ddl(f"CREATE NAMESPACE {NAMESPACE}")
        await client.ddl(
            f"CREATE TABLE {STREAM_TABLE} (id BIGINT NOT NULL, ts TIMESTAMP, amount DOUBLE)"
        )
        for i in range(writers):
            await client.ddl(f"CREATE TABLE {COMMIT_TABLE_PREFIX}{i} (id BIGINT, note STRING)")


# --- Spark: (a) plain and (b) bridge ----------------------------------------------------------
def start_spark(extra_conf: Sequence[tuple[str, str]] = ()) -> Any:
    from pyspark.sql import SparkSession

    from spark_bridge.bridge import ensure_python_workers

    ensure_python_workers()
    builder = (
        SparkSession.builder.master(SPARK_MASTER)
        .appName("bench-spark")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(RATE_PARTITIONS))
    )
    for key, value in extra_conf:
        builder = builder.config(key, value)
    return builder.getOrCreate()


def jvm_process(spark: Any) -> subprocess.Popen[bytes] | None:
    """The JVM pyspark started for this session (its `spark-submit` execs java), if any."""
    gateway = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return proc if isinstance(proc, subprocess.Popen) else None


def stop_spark(spark: Any) -> None:
    """Stop the session, then the JVM by its PID (pyspark keeps it for a next session)."""
    proc = jvm_process(spark)
    with contextlib.suppress(Exception):
        spark.stop()
    if proc is None:
        return
    gateway = getattr(spark.sparkContext, "_gateway", None)
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
    try:
        proc.wait(timeout=JVM_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=JVM_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=PROCESS_EXIT_WAIT_S)


def shape(df: Any) -> Any:
    """The batch's output rows, the same for (a) and (b)."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("value").alias("id"),
        F.col("timestamp").alias("ts"),
        (F.col("value") % 100 * 1.5).alias("amount"),
    )


def run_stream(
    spark: Any,
    kind: str,
    body: Callable[[Any, int], dict[str, Any] | None],
    *,
    params: BenchParams,
    batches: int,
    checkpoint: Path,
) -> tuple[list[tuple[int, float, float, dict[str, Any] | None]], float]:
    """Run a fresh rate -> foreachBatch(body) query until `batches` micro-batches are done;
    returns (batch id, wall ms, CPU ms, body's extras) per batch, in order, and the cores the
    rest of the machine used meanwhile."""
    jvm = jvm_process(spark)
    jvm_pid = jvm.pid if jvm is not None else None
    done: list[tuple[int, float, float, dict[str, Any] | None]] = []

    def cpu_now() -> float:
        return (cpu_seconds(jvm_pid) if jvm_pid else 0.0) + time.process_time()

    def timed(df: Any, batch_id: int) -> None:
        cpu0, started = cpu_now(), time.perf_counter()
        extras = body(df, batch_id)
        wall_ms = (time.perf_counter() - started) * 1000
        done.append((batch_id, wall_ms, (cpu_now() - cpu0) * 1000, extras))

    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", params.rows_per_second)
        .option("numPartitions", RATE_PARTITIONS)
        .load()
        .writeStream.queryName(f"bench_{kind}")
        .foreachBatch(timed)
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    deadline = time.monotonic() + batches * TRIGGER_MS / 1000 + STREAM_GRACE_S
    ours0, busy0, at0 = cpu_now(), machine_busy_seconds(), time.perf_counter()
    try:
        while len(done) < batches:
            failure = query.exception()
            if failure is not None:
                raise StreamFailedError(f"{kind} query failed: {failure}")
            if time.monotonic() > deadline:
                raise StreamFailedError(
                    f"{kind}: only {len(done)} of {batches} micro-batches in time"
                )
            time.sleep(POLL_INTERVAL_S)
    finally:
        query.stop()
        with contextlib.suppress(Exception):
            query.awaitTermination(STREAM_STOP_WAIT_S)
    window_s = time.perf_counter() - at0
    others = ((machine_busy_seconds() - busy0) - (cpu_now() - ours0)) / window_s
    # The query may have finished one more batch while stopping: keep exactly `batches`.
    return done[:batches], max(0.0, others)


def measure_streams(
    m: Measurements, params: BenchParams, *, endpoints: list[str], token: str, workdir: Path
) -> None:
    from spark_bridge.bridge import MetastoreBridge

    progress(f"starting Spark ({SPARK_MASTER}) {dict(params.spark_conf) or ''}")
    spark = start_spark(params.spark_conf)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        # Made before any run: it sets the Parquet field-id options for the whole session, so
        # both kinds write with the same settings.
        bridge = MetastoreBridge(spark, endpoints=endpoints, token=token, app_name="bench")
        try:
            m.plain, m.bridge = StreamRun(kind="plain"), StreamRun(kind="bridge")
            for round_no in range(-1, params.rounds):  # round -1: JVM warm-up, not measured
                warm = round_no < 0
                batches = params.warmup_batches + (2 if warm else params.batches_per_round)
                for kind in ("plain", "bridge"):
                    tag = f"r{round_no + 1}-{kind}"
                    if kind == "plain":
                        body = plain_body(workdir / "plain" / tag)
                    else:
                        body = bridge_body(bridge, f"bench-{uuid.uuid4().hex[:8]}-{tag}")
                    progress(f"  {'warm-up' if warm else f'round {round_no + 1}'}: {kind}")
                    raw, others = run_stream(
                        spark,
                        kind,
                        body,
                        params=params,
                        batches=batches,
                        checkpoint=workdir / f"ckpt-{tag}",
                    )
                    run = m.plain if kind == "plain" else m.bridge
                    keep = [] if warm else raw[params.warmup_batches :]
                    run.dropped += len(raw) - len(keep)
                    if not warm:
                        run.others_cores.append(others)
                    for batch_id, wall_ms, cpu_ms, extras in keep:
                        run.samples.append(
                            BatchSample(
                                round=round_no,
                                batch_id=batch_id,
                                wall_ms=wall_ms,
                                cpu_ms=cpu_ms,
                                **(extras or {}),
                            )
                        )
        finally:
            bridge.close()
    finally:
        progress("stopping Spark")
        stop_spark(spark)


def plain_body(directory: Path) -> Callable[[Any, int], dict[str, Any] | None]:
    """(a): the batch's rows written by Spark's Parquet writer into a fresh directory per batch,
    exactly as the bridge writes them (it writes each attempt into a fresh directory too)."""

    def body(df: Any, batch_id: int) -> dict[str, Any] | None:
        shape(df).write.mode("errorifexists").parquet(str(directory / f"batch-{batch_id}"))
        return None

    return body


def bridge_body(bridge: Any, query_name: str) -> Callable[[Any, int], dict[str, Any] | None]:
    """(b): `MetastoreBridge.foreach_batch` writing the same rows to STREAM_TABLE. A fresh
    `query_name` per run, to tell runs apart in the txn log (txn ids are
    `<query_name>:<query.id>:<batch id>`, so runs never collide anyway)."""
    reports: list[Any] = []

    def write(b: Any, df: Any) -> None:
        b.write(STREAM_TABLE, shape(df))

    run = bridge.foreach_batch(
        write, query_name=query_name, writes=[STREAM_TABLE], on_batch=reports.append
    )

    def body(df: Any, batch_id: int) -> dict[str, Any] | None:
        run(df, batch_id)
        r = reports[-1]
        return {"pin_ms": r.plan_ms, "commit_ms": r.commit_ms, "files": r.files, "rows": r.rows}

    return body


# --- (c) commits/s: writer processes ----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class WriterSpec:
    index: int
    endpoints: list[str]
    token: str
    table: str
    schema_version: int
    pipeline_depth: int
    warmup_s: float
    seconds: float


async def writer_run(spec: WriterSpec, pipe: multiprocessing.connection.Connection) -> None:
    from metastore.client import MetastoreClient
    from metastore.errors import MetastoreError

    async with MetastoreClient(
        spec.endpoints,
        spec.token,
        timeout_ms=WRITER_CLIENT_TIMEOUT_MS,
        client_name=f"bench-writer-{spec.index}",
    ) as client:
        seq = 0

        def request(n: int) -> list[dict[str, Any]]:
            add = {"path": f"w{spec.index}/{n}.parquet", "size_bytes": 4096, "row_count": 100}
            return [{"table": spec.table, "schema_version": spec.schema_version, "add": [add]}]

        first = await client.commit(f"w{spec.index}:{seq}", request(seq))  # connect, warm up
        acked_total = 1
        max_ts = int(first["ts"])
        pipe.send({"ready": True})
        if not pipe.poll(WRITER_READY_WAIT_S + WRITER_START_DELAY_S):
            return
        start_at = float(pipe.recv()["start_at"])
        await asyncio.sleep(max(0.0, start_at - time.time()))
        measure_from = time.perf_counter() + spec.warmup_s
        end = measure_from + spec.seconds
        acked_in_window = 0
        latencies: list[float] = []
        errors: Counter[str] = Counter()

        async def lane() -> None:
            nonlocal seq, acked_total, acked_in_window, max_ts
            while time.perf_counter() < end:
                seq += 1
                n = seq
                sent = time.perf_counter()
                try:
                    reply = await client.commit(f"w{spec.index}:{n}", request(n))
                except MetastoreError as exc:
                    errors[exc.code.value] += 1
                    continue
                done = time.perf_counter()
                acked_total += 1
                max_ts = max(max_ts, int(reply["ts"]))
                if measure_from <= done <= end:
                    acked_in_window += 1
                    if sent >= measure_from and len(latencies) < LATENCIES_KEPT_MAX:
                        latencies.append((done - sent) * 1000)

        await asyncio.gather(*(lane() for _ in range(spec.pipeline_depth)))
        pipe.send(
            {
                "acked_in_window": acked_in_window,
                "acked_total": acked_total,
                "max_ts": max_ts,
                "latencies_ms": latencies,
                "errors": dict(errors),
                "window_s": spec.seconds,
            }
        )


def writer_main(spec: WriterSpec, pipe: multiprocessing.connection.Connection) -> None:
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(writer_run(spec, pipe))
    except Exception as exc:
        with contextlib.suppress(OSError):
            pipe.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        pipe.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _kill(process: multiprocessing.process.BaseProcess, grace_s: float) -> None:
    """Give a child `grace_s` to exit, then SIGKILL it by its PID, and reap it."""
    process.join(grace_s)
    if process.is_alive() and process.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.join(PROCESS_EXIT_WAIT_S)


def measure_commits(
    m: Measurements, params: BenchParams, *, cluster: Cluster, leader: int, token: str
) -> None:
    endpoints = [f"127.0.0.1:{cluster.client_ports[n]}" for n in NODE_IDS]
    leader_endpoint = f"127.0.0.1:{cluster.client_ports[leader]}"
    # Every writer talks to the leader first (the others only on failover): a follower would
    # forward each commit to it, which measures forwarding, not commits.
    ordered = [leader_endpoint, *(e for e in endpoints if e != leader_endpoint)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that ran a JVM
    processes: list[multiprocessing.process.BaseProcess] = []
    pipes: list[multiprocessing.connection.Connection] = []
    try:
        for i in range(params.writers):
            parent, child = ctx.Pipe()
            spec = WriterSpec(
                index=i,
                endpoints=ordered,
                token=token,
                table=f"{COMMIT_TABLE_PREFIX}{i}",
                schema_version=1,
                pipeline_depth=params.pipeline_depth,
                warmup_s=params.commit_warmup_seconds,
                seconds=params.commit_seconds,
            )
            process = ctx.Process(target=writer_main, args=(spec, child), daemon=True)
            process.start()
            child.close()
            processes.append(process)
            pipes.append(parent)
        for i, pipe in enumerate(pipes):
            message = _receive(pipe, WRITER_READY_WAIT_S, f"writer {i} ready")
            if "error" in message:
                raise LoadProcessError(f"writer {i}: {message['error']}")
        start_at = time.time() + WRITER_START_DELAY_S
        for pipe in pipes:
            pipe.send({"start_at": start_at})
        progress(
            f"(c) {params.writers} writers x {params.pipeline_depth} in flight, "
            f"{params.commit_warmup_seconds:.0f} s warm-up + {params.commit_seconds:.0f} s"
        )
        time.sleep(max(0.0, start_at - time.time()) + params.commit_warmup_seconds)
        cpu_before = {n: cpu_seconds(cluster.pid(n)) for n in NODE_IDS}
        busy_before, at_before = machine_busy_seconds(), time.perf_counter()
        time.sleep(params.commit_seconds)
        cpu_after = {n: cpu_seconds(cluster.pid(n)) for n in NODE_IDS}
        busy_after, at_after = machine_busy_seconds(), time.perf_counter()
        window = at_after - at_before
        bound = WRITER_REPORT_GRACE_S
        reports = [_receive(p, bound, f"writer {i} report") for i, p in enumerate(pipes)]
    finally:
        for child_process in processes:
            _kill(child_process, PROCESS_EXIT_WAIT_S)
        for pipe in pipes:
            pipe.close()
    failed = [r["error"] for r in reports if "error" in r]
    if failed:
        raise LoadProcessError(f"writers failed: {failed}")
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    for r in reports:
        errors.update(r["errors"])
        latencies.extend(r["latencies_ms"])
    acked_in_window = sum(int(r["acked_in_window"]) for r in reports)
    acked_total = sum(int(r["acked_total"]) for r in reports)
    m.commits = CommitRun(
        writers=params.writers,
        pipeline_depth=params.pipeline_depth,
        window_s=params.commit_seconds,
        acked_in_window=acked_in_window,
        acked_total=acked_total,
        max_commit_ts=max(int(r["max_ts"]) for r in reports),
        errors=dict(errors),
        latencies_ms=latencies,
        leader=leader,
        leader_after=None,
        via="leader",
        node_cpu_cores={n: (cpu_after[n] - cpu_before[n]) / window for n in NODE_IDS},
        machine_busy_cores=(busy_after - busy_before) / window,
        files_committed=None,
        files_at_safe_time=None,
        commits_per_s=acked_in_window / params.commit_seconds,
    )
    # At once, before anything else: a node that lags the last commits shows it only now.
    m.commits.files_at_safe_time = asyncio.run(
        count_files(ordered, token, params.writers, as_of=None)
    )
    m.commits.leader_after = asyncio.run(cluster.wait_ready(CLUSTER_START_WAIT_S))
    m.commits.files_committed = asyncio.run(
        count_committed_files(
            endpoints, token, params.writers, acked_total, m.commits.max_commit_ts
        )
    )


def _receive(
    pipe: multiprocessing.connection.Connection, timeout_s: float, what: str
) -> dict[str, Any]:
    if not pipe.poll(timeout_s):
        raise LoadProcessError(f"no {what} within {timeout_s} s")
    try:
        message = pipe.recv()
    except EOFError:
        raise LoadProcessError(f"{what}: the process exited without reporting") from None
    if not isinstance(message, dict):
        raise LoadProcessError(f"{what}: unexpected message {message!r}")
    return message


async def count_committed_files(
    endpoints: list[str], token: str, writers: int, acked_total: int, as_of: int
) -> int:
    """Every acknowledged commit added exactly one file: the tables must hold exactly that many
    (no commit lost, none applied twice). Read AS OF the newest acknowledged commit timestamp,
    not at the answering node's safe time (the `files` default), which on a node that has
    not applied the last commits yet would miss them."""
    total = await count_files(endpoints, token, writers, as_of=as_of)
    if total != acked_total:
        raise IntegrityError(f"{total} files committed, but {acked_total} commits acknowledged")
    return total


async def count_files(endpoints: list[str], token: str, writers: int, *, as_of: int | None) -> int:
    from metastore.client import MetastoreClient

    async with MetastoreClient(endpoints, token, timeout_ms=REQUEST_TIMEOUT_MS) as client:
        total = 0
        for i in range(writers):
            listing = await client.files(f"{COMMIT_TABLE_PREFIX}{i}", as_of=as_of)
            total += len(listing["files"])
    return total


# --- Orchestration ----------------------------------------------------------------------------
def run(params: BenchParams) -> tuple[Measurements, str | None]:
    params.validate()
    m = Measurements()
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        workdir = Path(tmp)
        cluster = Cluster(workdir)
        try:
            asyncio.run(cluster.start_all(CLUSTER_START_WAIT_S))
            leader = asyncio.run(cluster.wait_ready(CLUSTER_START_WAIT_S))
            token = cluster.token("admin")
            endpoints = [f"127.0.0.1:{cluster.client_ports[n]}" for n in NODE_IDS]
            progress(f"cluster ready, leader node {leader}")
            asyncio.run(setup_tables(endpoints, token, params.writers))
            measure_streams(m, params, endpoints=endpoints, token=token, workdir=workdir)
            cluster.check_alive()
            # The leader may have changed under Spark's load (it should not): ask again.
            leader = asyncio.run(cluster.wait_ready(CLUSTER_START_WAIT_S))
            measure_commits(m, params, cluster=cluster, leader=leader, token=token)
            cluster.check_alive()
        except BenchError as exc:
            for node_id in NODE_IDS:
                progress(f"node {node_id} log tail:\n{cluster.log_tail(node_id)}")
            progress(f"FAILED ({exc.code}): {exc}")
            return m, f"{exc.code}: {exc}"
        except Exception as exc:
            # A MetastoreError from setup, a Spark failure, ...: report it with what was measured.
            progress(f"FAILED: {type(exc).__name__}: {exc}")
            return m, f"{RequestFailedError.code}: {type(exc).__name__}: {exc}"
        finally:
            cluster.stop_all()
    return m, None


# --- Targets and report -----------------------------------------------------------------------
def evaluate_targets(m: Measurements) -> dict[str, dict[str, Any]]:
    ratio = m.ratio("median")
    cps = m.commits.commits_per_s if m.commits else None
    return {
        "batch_ratio_median": {
            "target": f"<= {TARGET_BATCH_RATIO_MAX}",
            "value": ratio,
            "met": None if ratio is None else ratio <= TARGET_BATCH_RATIO_MAX,
        },
        "commits_per_s": {
            "target": f">= {TARGET_COMMITS_PER_S_MIN:.0f}",
            "value": cps,
            "met": None if cps is None else cps >= TARGET_COMMITS_PER_S_MIN,
        },
    }


def _mark(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "MISSED")


def _ms(stats: dict[str, Any] | None, *keys: str) -> str:
    if not stats or stats.get("median") is None:
        return "-"
    return " / ".join(f"{float(stats[k]):.1f}" for k in keys)


def render_table(m: Measurements, targets: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="Spark bridge (make bench-spark)", title_justify="left")
    for name in ("metric", "value", "target", "verdict"):
        table.add_column(name)
    plain = summary(m.plain.wall_ms()) if m.plain else None
    bridge_json = m.bridge.to_json() if m.bridge else None
    bridge = bridge_json["batch_ms"] if bridge_json else None
    table.add_row("(a) plain batch ms, median / p90", _ms(plain, "median", "p90"), "", "")
    table.add_row("(b) bridge batch ms, median / p90", _ms(bridge, "median", "p90"), "", "")
    t = targets["batch_ratio_median"]
    ratio_p90 = m.ratio("p90")
    table.add_row(
        "bridge / plain, median (p90)",
        "-"
        if t["value"] is None
        else f"{t['value']:.3f} ({ratio_p90:.3f})"
        if ratio_p90
        else f"{t['value']:.3f}",
        t["target"],
        _mark(t["met"]),
    )
    if plain and bridge and plain["median"] is not None and bridge["median"] is not None:
        extra = float(bridge["median"]) - float(plain["median"])
        table.add_row("bridge - plain, median ms", f"{extra:.1f}", "", "")
    per_round = m.round_ratios()
    if per_round:
        table.add_row("bridge / plain per round", " ".join(f"{r:.2f}" for r in per_round))
    if m.plain and m.bridge and m.plain.others_cores and m.bridge.others_cores:
        table.add_row(
            "others' cores during runs, plain / bridge",
            f"{statistics.median(m.plain.others_cores):.2f} / "
            f"{statistics.median(m.bridge.others_cores):.2f} (median of runs)",
        )
    cpu_ratio = m.ratio("median", cpu=True)
    if cpu_ratio is not None and m.plain and m.bridge:
        table.add_row(
            "Spark+driver CPU ms/batch, plain / bridge",
            _ms(summary(m.plain.cpu_ms()), "median")
            + " / "
            + _ms(summary(m.bridge.cpu_ms()), "median")
            + f" ({cpu_ratio:.3f})",
        )
    if bridge_json and "pin_ms" in bridge_json:
        table.add_row("bridge pin ms, median / p90", _ms(bridge_json["pin_ms"], "median", "p90"))
        table.add_row(
            "bridge commit ms, median / p90", _ms(bridge_json["commit_ms"], "median", "p90")
        )
        table.add_row(
            "bridge write + rest ms, median", _ms(bridge_json["write_and_rest_ms"], "median")
        )
        share = m.pin_commit_share()
        if share is not None:
            table.add_row("(plain + pin + commit) / plain, medians", f"{share:.3f}")
        table.add_row(
            "rows / files per batch, median",
            f"{bridge_json['rows_per_batch']['median']:.0f} / "
            f"{bridge_json['files_per_batch']['median']:.0f}",
        )
    c = m.commits
    t = targets["commits_per_s"]
    table.add_row(
        f"(c) commits/s, {c.writers if c else '-'} writers",
        "-" if t["value"] is None else f"{t['value']:.0f}",
        t["target"],
        _mark(t["met"]),
    )
    if c is not None:
        lat = summary(c.latencies_ms)
        table.add_row("commit latency ms, p50 / p99", _ms(lat, "median", "p99"))
        table.add_row("commit errors", json.dumps(c.errors) if c.errors else "0")
        table.add_row(
            "files committed = commits acked",
            f"{c.files_committed} = {c.acked_total}",
            "equal",
            _mark(c.files_committed == c.acked_total),
        )
        cpu = ", ".join(
            f"{'L' if n == c.leader else 'F'}{n} {v:.2f}" for n, v in c.node_cpu_cores.items()
        )
        table.add_row("node CPU (cores) during (c)", cpu)
        if c.leader_after is not None and c.leader_after != c.leader:
            table.add_row("leader changed during (c)", f"{c.leader} -> {c.leader_after}")
        table.add_row("machine busy (cores of 2)", f"{c.machine_busy_cores:.2f}")
    return table


def write_results(
    results_dir: Path,
    *,
    started: datetime,
    argv: Sequence[str],
    params: BenchParams,
    machine: dict[str, Any],
    m: Measurements,
    error: str | None,
    targets: dict[str, dict[str, Any]],
) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"spark-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    document = {
        "started_utc": started.isoformat(),
        "finished_utc": datetime.now(UTC).isoformat(),
        "command": " ".join(["python -m bench.bench_spark", *argv]),
        "machine": {
            **machine,
            "loadavg_1_5_15_min_at_end": list(os.getloadavg())
            if hasattr(os, "getloadavg")
            else None,
        },
        "cluster": {"nodes": len(NODE_IDS), "dd_ms": DD_MS, "cs_max_ms": CS_MAX_MS, "fsync": True},
        "workload": {
            "spark_master": SPARK_MASTER,
            "rows_per_second": params.rows_per_second,
            "rate_partitions": RATE_PARTITIONS,
            "trigger_ms": TRIGGER_MS,
        },
        "params": asdict(params),
        "complete": error is None,
        "error": error,
        "results": m.to_json(),
        "targets": targets,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


# --- Entry point ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_spark",
        description="Per-micro-batch overhead of the Spark bridge, and commits/s of the cluster",
    )
    parser.add_argument("--quick", action="store_true", help="fewer micro-batches, shorter load")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra Spark session setting for both kinds of run (repeatable)",
    )
    args = parser.parse_args(argv)
    spark_conf = []
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--spark-conf {item!r} is not KEY=VALUE")
        spark_conf.append((key.strip(), value.strip()))
    params = BenchParams.for_mode(quick=args.quick, spark_conf=tuple(spark_conf))
    started = datetime.now(UTC)
    machine = machine_info()
    progress(f"load average before the run: {machine['loadavg_1_5_15_min']}")
    try:
        with sigterm_as_interrupt():
            m, error = run(params)
    except KeyboardInterrupt:
        progress("interrupted; node, writer and Spark processes were stopped")
        return 130
    targets = evaluate_targets(m)
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH_NON_TTY)
    path = write_results(
        args.results_dir,
        started=started,
        argv=argv,
        params=params,
        machine=machine,
        m=m,
        error=error,
        targets=targets,
    )
    progress(f"results written to {path}")
    console.print(render_table(m, targets))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
