"""Helpers for the real-Spark tests: a running 3-node cluster with clients, pyarrow file writes
and bounded waits.

`SparkEnv` wraps the daemon harness's `MetastoreCluster` (real node processes on 127.0.0.1,
warehouse `<cluster dir>/warehouse`) with a shared failover client, single-node clients (one
endpoint each: what *that* node answers, no failover) and bridges bound to the session's Spark.
Everything it opens it closes in `close()`; node processes are stopped by the harness, by PID.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from metastore.client import SyncMetastoreClient
from spark_bridge.bridge import MetastoreBridge
from spark_bridge.files import DataFile, new_attempt_dir
from tests.daemon.harness import MetastoreCluster

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")

# One call's budget for the shared client: long enough to ride out a leader election.
CLIENT_TIMEOUT_MS = 20_000
# A single-node client must answer quickly or say why: it has nowhere to fail over to.
SINGLE_TIMEOUT_MS = 10_000
# Upper bound for the waits of these tests (streams, subprocesses, readiness).
WAIT_S = 60.0
HLC_MS = 1 << 16  # one physical millisecond in HLC units
FIELD_ID_KEY = b"PARQUET:field_id"

_ARROW_TYPES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "INT": pa.int32(),
    "STRING": pa.string(),
    "DOUBLE": pa.float64(),
}


def wait_until(pred: Callable[[], T | None], *, timeout_s: float = WAIT_S, what: str) -> T:
    """Poll `pred` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def physical_ms(ts: int) -> int:
    return ts >> 16


class SparkEnv:
    def __init__(self, cluster: MetastoreCluster, spark: SparkSession) -> None:
        self.cluster = cluster
        self.spark = spark
        self.token = cluster.token("admin")
        self.endpoints = [f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids]
        self.warehouse = cluster.dir / "warehouse"
        self.client = SyncMetastoreClient(
            self.endpoints, self.token, timeout_ms=CLIENT_TIMEOUT_MS, client_name="spark-tests"
        )
        self._opened: list[SyncMetastoreClient | MetastoreBridge] = [self.client]
        self._lock = threading.Lock()

    def endpoint(self, node_id: int) -> str:
        return f"127.0.0.1:{self.cluster.client_ports[node_id]}"

    def single(self, node_id: int) -> SyncMetastoreClient:
        """A client of exactly one node (no failover): that node's own answers."""
        c = SyncMetastoreClient(
            [self.endpoint(node_id)],
            self.token,
            timeout_ms=SINGLE_TIMEOUT_MS,
            client_name=f"spark-tests-node{node_id}",
        )
        with self._lock:
            self._opened.append(c)
        return c

    def bridge(
        self, *, node_id: int | None = None, app_name: str = "tests", leases: bool = True
    ) -> MetastoreBridge:
        """A bridge on the session's Spark; with `node_id`, its client talks to that node only;
        `leases=False` runs batches without schema leases (only the commit rule protects)."""
        if node_id is None:
            client = SyncMetastoreClient(
                self.endpoints, self.token, timeout_ms=CLIENT_TIMEOUT_MS, client_name=app_name
            )
            endpoints = self.endpoints
        else:
            client = self.single(node_id)
            endpoints = [self.endpoint(node_id)]
        b = MetastoreBridge(
            self.spark,
            endpoints=endpoints,
            token=self.token,
            app_name=app_name,
            client=client,
            leases=leases,
        )
        with self._lock:
            self._opened.append(b)
        return b

    def ddl(self, *statements: str) -> list[dict[str, Any]]:
        """Run DDL statements concurrently (each waits about DD + CSmax for its activation, so
        independent statements are cheaper together); results in statement order."""
        with ThreadPoolExecutor(max_workers=len(statements)) as pool:
            futures = [pool.submit(self.client.ddl, sql) for sql in statements]
            return [f.result(timeout=WAIT_S) for f in futures]

    def location(self, table: str) -> str:
        return str(self.client.schema_at(table)["location"])

    def live_paths(self, table: str, as_of: int | None = None) -> set[str]:
        return {f["path"] for f in self.client.files(table, as_of=as_of)["files"]}

    def close(self) -> None:
        for item in reversed(self._opened):
            item.close()
        # The session keepers `register()` started for this cluster (its bridges did).
        from spark_bridge.datasource import stop_session_keepers

        stop_session_keepers()


def write_parquet(
    location: str, rel_dir: str, columns: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> DataFile:
    """One Parquet file under `location/rel_dir` shaped like the pinned `columns` (with their
    field ids), as an executor would write it."""
    schema = pa.schema(
        [
            pa.field(
                c["name"],
                _ARROW_TYPES[c["type"]],
                nullable=bool(c["nullable"]),
                metadata={FIELD_ID_KEY: str(c["field_id"]).encode()},
            )
            for c in columns
        ]
    )
    directory = Path(location) / rel_dir
    directory.mkdir(parents=True, exist_ok=True)
    rel = f"{rel_dir}/part-{uuid.uuid4().hex}.parquet"
    path = Path(location) / rel
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return DataFile(path=rel, size_bytes=path.stat().st_size, row_count=len(rows))


def write_attempt(
    client: SyncMetastoreClient, table: str, txn_id: str, rows: list[dict[str, Any]]
) -> tuple[dict[str, Any], DataFile]:
    """Pin `table` now and write `rows` into a fresh attempt directory, as the bridge does.
    Returns (the table's write entry for a commit, the file)."""
    pinned = client.schema_at(table)
    _, rel_dir = new_attempt_dir(pinned["location"], txn_id)
    f = write_parquet(pinned["location"], rel_dir, pinned["schema"]["columns"], rows)
    write = {
        "table": table,
        "schema_version": int(pinned["version"]),
        "table_id": int(pinned["table_id"]),
        "add": [f.to_wire()],
    }
    return write, f


def rows_of(df: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    """The DataFrame's rows as sorted tuples (of `columns`, default all)."""
    picked = df.select(*columns) if columns else df
    return sorted(tuple(r) for r in picked.collect())


def committed_txns(client: SyncMetastoreClient, prefix: str = "") -> list[dict[str, Any]]:
    """Every remembered commit (oldest first) whose txn id starts with `prefix`."""
    log = client.txn_log(limit=10_000)["commits"]
    return [c for c in reversed(log) if str(c["txn_id"]).startswith(prefix)]


def only(items: Iterable[T]) -> T:
    found = list(items)
    assert len(found) == 1, found
    return found[0]


def start_driver(env: SparkEnv, module: str, *args: str) -> subprocess.Popen[str]:
    """Start `python -m <module> --endpoints ... --token-file <admin token> *args` (one of this
    package's driver scripts) with text pipes; the caller kills it by PID."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "--endpoints",
            ",".join(env.endpoints),
            "--token-file",
            str(env.cluster.dir / "secrets" / "admin.token"),
            *args,
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line_within(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """One line of a child's stdout, or AssertionError if none comes within `timeout_s`."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout_s):
            raise AssertionError(f"driver printed nothing within {timeout_s:.0f} s")
        return proc.stdout.readline()
    finally:
        sel.close()
