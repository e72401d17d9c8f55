"""`make demo`: a local 3-node metastore cluster feeding a Spark Structured Streaming pipeline.

What it shows, in order (it finishes by itself and stops everything it started):
1. `metastore cluster init/up` — three daemon processes on 127.0.0.1.
2. DDL through the CLI: a namespace and two tables.
3. A streaming query (rate source -> foreachBatch through the bridge) writing two tables, each
   micro-batch pinned at its own Top and committed atomically to both tables.
4. While it runs: `metastore sql "ALTER TABLE ... ADD COLUMN"`; the column shows up from the first
   micro-batch whose Top >= Tu, with no restart. Meanwhile a poller asks all three nodes about the
   same Top and prints their answers side by side — always the same version.
5. kill -9 of the Raft leader mid-stream; the stream carries on (the client fails over), and the
   node is restarted.
6. Time travel: both tables read AS OF several commit timestamps always agree (every event row is
   counted in exactly one totals row at every timestamp: the commits are atomic).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / ".local" / "demo"
BASE_PORT = 27100
STREAM_SECONDS = 45
TRIGGER_S = 2


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cli.main", *args]
    print("$ metastore " + " ".join(a if " " not in a else repr(a) for a in args), flush=True)
    env = {
        **os.environ,
        "METASTORE_ENDPOINTS": endpoints_arg(),
        "METASTORE_TOKEN_FILE": str(DEMO_DIR / "secrets" / "admin.token"),
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=120)
    out = (proc.stdout + proc.stderr).rstrip()
    if out:
        print(out, flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo step failed: metastore {' '.join(args)} (exit {proc.returncode})")
    return proc


def endpoints() -> list[str]:
    return [f"127.0.0.1:{BASE_PORT + 101 + i}" for i in range(3)]


def endpoints_arg() -> str:
    return ",".join(endpoints())


def leader_pid() -> tuple[int, int]:
    from metastore.client import SyncMetastoreClient

    token = (DEMO_DIR / "secrets" / "admin.token").read_text().strip()
    with SyncMetastoreClient(endpoints(), token) as c:
        leader = int(c.status()["leader"])
    from cli.processes import read_pid
    from metastore.daemon.config import load_cluster_config

    pid = read_pid(load_cluster_config(DEMO_DIR / "cluster.toml").node_pid_file(leader))
    if pid is None:
        raise SystemExit(f"no pid file for node {leader}")
    return leader, pid


class Poller(threading.Thread):
    """Asks all three nodes about the same Top every second and prints the answers."""

    def __init__(self, table: str) -> None:
        super().__init__(daemon=True)
        self.table = table
        self.stop = threading.Event()
        self.disagreements = 0
        self.polls = 0

    def run(self) -> None:
        from metastore.client import SyncMetastoreClient
        from metastore.errors import MetastoreError

        token = (DEMO_DIR / "secrets" / "admin.token").read_text().strip()
        clients = [SyncMetastoreClient([e], token, timeout_ms=2000) for e in endpoints()]
        try:
            while not self.stop.wait(1.5):
                top = clients[0].clock.now()
                answers = []
                for c in clients:
                    try:
                        answers.append(f"v{c.schema_at(self.table, ts=top)['version']}")
                    except MetastoreError as exc:
                        answers.append(exc.code.value.lower())
                versions = {a for a in answers if a.startswith("v")}
                self.polls += 1
                self.disagreements += len(versions) > 1
                from hlc import to_iso

                print(
                    f"   [poll] schema of {self.table} at Top={to_iso(top)}: "
                    f"node1 {answers[0]}  node2 {answers[1]}  node3 {answers[2]}",
                    flush=True,
                )
        finally:
            for c in clients:
                c.close()


def main() -> int:
    from spark_bridge.bridge import ensure_python_workers

    ensure_python_workers()
    started = time.monotonic()
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)
    DEMO_DIR.parent.mkdir(parents=True, exist_ok=True)
    say("1. A 3-node metastore cluster on 127.0.0.1")
    cli("cluster", "init", str(DEMO_DIR), "--cluster-id", "demo", "--base-port", str(BASE_PORT))
    cli("cluster", "up", "--config", str(DEMO_DIR))
    spark = None
    poller = None
    try:
        say("2. DDL through the CLI")
        cli("sql", "CREATE NAMESPACE shop")
        cli("sql", "CREATE TABLE shop.events (id BIGINT NOT NULL, ts TIMESTAMP, amount DOUBLE)")
        cli("sql", "CREATE TABLE shop.totals (batch_id BIGINT, events BIGINT, amount DOUBLE)")
        spark = start_spark()
        run_stream(spark)
        return 0
    finally:
        if poller is not None:
            poller.stop.set()
        if spark is not None:
            spark.stop()
        say("Stopping the cluster")
        cli("cluster", "down", "--config", str(DEMO_DIR), check=False)
        print(f"\ndemo finished in {time.monotonic() - started:.0f} s", flush=True)


def start_spark() -> Any:
    from pyspark.sql import SparkSession

    say("3. Spark (local[2]) with the metastore bridge")
    return (
        SparkSession.builder.master("local[2]")
        .appName("metastore-demo")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def run_stream(spark: Any) -> None:
    from pyspark.sql import functions as F

    from hlc import to_iso
    from spark_bridge.bridge import BatchContext, BatchReport, MetastoreBridge

    token = (DEMO_DIR / "secrets" / "admin.token").read_text().strip()
    spark.sparkContext.setLogLevel("ERROR")
    bridge = MetastoreBridge(spark, endpoints=endpoints(), token=token, app_name="demo")
    reports: list[BatchReport] = []

    def body(b: BatchContext, df: Any) -> None:
        events = df.select(
            F.col("value").alias("id"),
            F.col("timestamp").alias("ts"),
            (F.col("value") % 100 * 1.5).alias("amount"),
        )
        if "channel" in b.schema("shop.events").fieldNames():
            # The pinned schema has the new column: this batch's Top is past its Tu.
            events = events.withColumn(
                "channel", F.when(F.col("id") % 2 == 0, "web").otherwise("store")
            )
        b.write("shop.events", events)
        agg = events.agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        b.write(
            "shop.totals",
            agg.select(F.lit(len(reports)).cast("bigint").alias("batch_id"), "events", "amount"),
        )

    def on_batch(report: BatchReport) -> None:
        reports.append(report)
        print(
            f"   [batch {len(reports) - 1:>2}] Top={to_iso(report.top)} "
            f"pinned {report.pinned}  waited {report.waited_ms:.1f} ms  "
            f"commit ts={to_iso(report.commit_ts) if report.commit_ts else '-'}  "
            f"rows={report.rows}",
            flush=True,
        )

    say("4. Streaming: rate source -> foreachBatch -> shop.events + shop.totals (atomic)")
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .writeStream.foreachBatch(
            bridge.foreach_batch(
                body,
                query_name="demo-stream",
                writes=["shop.events", "shop.totals"],
                on_batch=on_batch,
            )
        )
        .trigger(processingTime=f"{TRIGGER_S} seconds")
        .option("checkpointLocation", str(DEMO_DIR / "checkpoint"))
        .start()
    )
    poller = Poller("shop.events")
    poller.start()
    try:
        wait_batches(reports, 3, stream)
        say("5. ALTER TABLE while the stream runs (no restart)")
        proc = cli("-o", "json", "sql", "ALTER TABLE shop.events ADD COLUMN channel STRING")
        tu = int(json.loads(proc.stdout)["tu"])
        print(f"   new version activates at Tu={to_iso(tu)}", flush=True)
        wait_batches(reports, len(reports) + 3, stream)
        say("6. kill -9 the Raft leader mid-stream")
        leader, pid = leader_pid()
        os.kill(pid, signal.SIGKILL)
        print(f"   killed node {leader} (pid {pid})", flush=True)
        wait_batches(reports, len(reports) + 3, stream)
        say("7. Restart the killed node; it catches up and serves again")
        cli("cluster", "up", "--missing", "--config", str(DEMO_DIR))
        wait_batches(reports, len(reports) + 2, stream)
    finally:
        stream.stop()
        poller.stop.set()
        poller.join(timeout=10)
    first_new = next((r for r in reports if r.top >= tu), None)
    print(f"\n   schema polls: {poller.polls}, nodes disagreeing: {poller.disagreements}")
    if first_new is not None:
        print(
            f"   first micro-batch with Top >= Tu: Top={to_iso(first_new.top)} pinned "
            f"{first_new.pinned}"
        )

    say("8. Time travel: both tables AS OF several commit timestamps")
    commits = [r.commit_ts for r in reports if r.commit_ts][1 :: max(1, len(reports) // 5)]
    for ts in commits:
        events = bridge.read_table("shop.events", as_of=ts)
        totals = bridge.read_table("shop.totals", as_of=ts)
        n_events = events.count()
        row = totals.agg(F.sum("events")).first()
        n_total = (row[0] if row is not None else 0) or 0
        cols = ", ".join(events.columns)
        ok = "agree" if n_events == n_total else "DISAGREE"
        print(
            f"   AS OF {to_iso(ts)}: events={n_events:>5}  sum(totals.events)={n_total:>5}  "
            f"-> {ok}   [events columns: {cols}]",
            flush=True,
        )
    bridge.close()


def wait_batches(reports: list[Any], n: int, stream: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(reports) < n:
        if stream.exception() is not None:
            raise SystemExit(f"the streaming query failed: {stream.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(reports)} micro-batches after {timeout_s} s")
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
