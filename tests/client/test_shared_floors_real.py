"""Two client objects of one process read each other's writes, on real daemons.

A Spark driver often holds several clients of one cluster (a bridge's, a second bridge's, a
plain `SyncMetastoreClient` of its own; a streaming job's foreachBatch and a separate reader).
Read-your-writes (`own_writes_ts`) and monotonic reads (the read floors) used to be per client
object: a second client's listing without `as_of` read at the answering node's safe time,
which trails a commit that landed above its entry's Tm (up to DD) until the next entry, and
missed the first client's commit; a second bridge's batch read below it.

The lag is deterministic: each commit lands `AHEAD_MS` above its entry's Tm (`not_before`), and
safe time (the Tm of the last applied entry) moves only with the next entry, which an idle
cluster writes once a second (`idle_safe_time_interval_ms`), so every node's safe time stays
below the commit's ts for that long. The reads below come within milliseconds.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StructField, StructType

from hlc.limits import LOGICAL_BITS
from metastore.client import SyncMetastoreClient
from spark_bridge import datasource
from spark_bridge.keeper import SessionKeeper
from tests.client.bridge_stub import bare_bridge
from tests.client.spark_task import write_rows
from tests.daemon.harness import REPO, MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

DD_MS = 1_000
AHEAD_MS = 700  # below DD: the commit is allowed to land this far above its entry's Tm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    """Safe time moves only with entries, or once a second when idle: it trails a commit that
    landed ahead of its entry for that long (every test uses its own namespace)."""
    with metastore_cluster(
        tmp_path_factory.mktemp("shared-floors"),
        dd_ms=DD_MS,
        cs_max_ms=100,
        idle_safe_time_interval_ms=1000,
    ) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _endpoint(c: MetastoreCluster, node_id: int) -> str:
    return f"127.0.0.1:{c.client_ports[node_id]}"


def _commit_ahead(client: SyncMetastoreClient, table: str, path: str) -> int:
    """Commit one file to `table`, landing AHEAD_MS above the entry's Tm; its ts."""
    not_before = client.clock.now() + (AHEAD_MS << LOGICAL_BITS)
    r = client.commit(
        f"{table}:{path}",
        [
            {
                "table": table,
                "schema_version": 1,
                "add": [{"path": path, "size_bytes": 1, "row_count": 1}],
            }
        ],
        not_before=not_before,
    )
    assert r["ts"] >= not_before > r["tm"]
    return int(r["ts"])


def test_a_second_client_of_the_process_reads_the_first_clients_table_and_commit(
    cluster: MetastoreCluster,
) -> None:
    c = cluster
    leader = c.wait_ready()
    follower = next(i for i in c.ids if i != leader)
    # The writer talks to the leader; the reader, another object, to a follower only.
    writer = SyncMetastoreClient([_endpoint(c, leader)], c.token("writer"), client_name="w")
    reader = SyncMetastoreClient([_endpoint(c, follower)], c.token("reader"), client_name="r")
    try:
        reader.status()  # the reader knows its cluster before the writer writes anything
        writer.ddl("CREATE NAMESPACE two")
        writer.ddl("CREATE TABLE two.t (a INT)")
        # The table the writer just created: not TABLE_NOT_FOUND on the follower.
        assert reader.files("two.t")["files"] == []
        for n in range(3):
            ts = _commit_ahead(writer, "two.t", f"w/{n}.parquet")
            listing = reader.files("two.t")
            assert listing["as_of"] >= ts, "the reader read below the writer's commit"
            assert f"w/{n}.parquet" in {f["path"] for f in listing["files"]}
            multi = reader.files_multi(["two.t"])["listings"][0]
            assert f"w/{n}.parquet" in {f["path"] for f in multi["files"]}
            # Monotonic across the two objects: the writer's reads go on from the reader's.
            assert writer.files("two.t")["as_of"] >= listing["as_of"]
    finally:
        reader.close()
        writer.close()


def test_a_bridge_batch_reads_another_clients_commit_of_the_same_process(
    cluster: MetastoreCluster,
) -> None:
    """A bridge batch reads at an explicit read_ts, at least its own bridge's last commit: a
    commit by another client object of the driver (another bridge, a plain client) was
    below that floor, and the batch missed it."""
    c = cluster
    endpoints = [_endpoint(c, i) for i in c.ids]
    other = SyncMetastoreClient(endpoints, c.token("writer"), client_name="other")
    mine = SyncMetastoreClient(list(reversed(endpoints)), c.token("writer"), client_name="mine")
    try:
        other.ddl("CREATE NAMESPACE bridged")
        location = c.dir / "warehouse" / "bridged_t"
        other.ddl(f"CREATE TABLE bridged.t (a INT) LOCATION '{location}'")
        mine.status()  # connected: it knows which cluster it talks to
        bridge = bare_bridge(mine)
        ts = _commit_ahead(other, "bridged.t", "o/p.parquet")
        with bridge.batch(reads=["bridged.t"]) as b:
            assert b.read_ts >= ts, "the batch read below another client's commit"
            _, files = b.files("bridged.t")
        assert [f["path"] for f in files] == ["o/p.parquet"]
    finally:
        mine.close()
        other.close()


def test_after_another_process_s_commit_read_ts_brings_the_bridge_s_batch_above_it(
    cluster: MetastoreCluster,
) -> None:
    """Another process's commit (here a raw connection, which shares nothing with this
    process's clients: a data source append commits in a Python worker process) is not
    known to the bridge; `read_ts()` on its client (linearizable) raises the process's floor
    above it, and the next batch reads it."""
    c = cluster
    leader = c.wait_ready()
    endpoints = [_endpoint(c, i) for i in c.ids]
    mine = SyncMetastoreClient(endpoints, c.token("writer"), client_name="mine")
    raw = c.client(leader, role="writer")
    try:
        mine.ddl("CREATE NAMESPACE elsewhere")
        location = c.dir / "warehouse" / "elsewhere_t"
        mine.ddl(f"CREATE TABLE elsewhere.t (a INT) LOCATION '{location}'")
        bridge = bare_bridge(mine)
        not_before = mine.clock.now() + (AHEAD_MS << LOGICAL_BITS)
        add = [{"path": "p/x.parquet", "size_bytes": 1, "row_count": 1}]
        r = raw.call(
            "commit",
            txn_id="elsewhere-1",
            not_before=not_before,
            writes=[{"table": "elsewhere.t", "schema_version": 1, "add": add}],
        )
        assert r["ok"], r
        committed_ts = int(r["result"]["ts"])
        assert mine.read_ts() >= committed_ts
        with bridge.batch(reads=["elsewhere.t"]) as b:
            assert b.read_ts >= committed_ts
            _, files = b.files("elsewhere.t")
        assert [f["path"] for f in files] == ["p/x.parquet"]
    finally:
        raw.close()
        mine.close()


def test_a_data_source_append_committed_in_a_worker_is_read_by_the_next_bridge_batch(
    cluster: MetastoreCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A `format("metastore")` append commits in a Python worker process of the driver host,
    whose clients share nothing with the driver's. The commit hands its position to the
    driver's session keeper (a file in its directory), and the next bridge batch of the driver
    reads at or above it; before, it read below and missed the rows just appended.

    The data source's steps run as Spark runs them (the writer pickled between them), the
    commit in a process of its own. The keeper's thread is idle, so only the bridge's own
    lookup can take the position in."""
    c = cluster
    endpoints = [_endpoint(c, i) for i in c.ids]
    token = c.token("writer")
    monkeypatch.setattr(SessionKeeper, "_round", lambda self: None)
    setup = SyncMetastoreClient(endpoints, token, client_name="setup")
    registered: list[Any] = []
    spark = SimpleNamespace(dataSource=SimpleNamespace(register=registered.append))
    datasource.register(spark, endpoints=endpoints, token=token)  # type: ignore[arg-type]
    (source,) = registered
    mine = SyncMetastoreClient(list(reversed(endpoints)), token, client_name="mine")
    try:
        setup.ddl("CREATE NAMESPACE appended")
        location = c.dir / "warehouse" / "appended_t"
        setup.ddl(f"CREATE TABLE appended.t (id BIGINT) LOCATION '{location}'")
        mine.status()  # connected: it knows which cluster it talks to
        planned = source(options={"table": "appended.t"})
        writer = pickle.loads(
            pickle.dumps(planned.writer(StructType([StructField("id", LongType())]), False))
        )
        writer.not_before = setup.clock.now() + (AHEAD_MS << LOGICAL_BITS)
        message = write_rows(writer, [Row(id=1)])
        step = tmp_path / "commit.pickle"
        step.write_bytes(pickle.dumps((writer, message)))
        subprocess.run(
            [sys.executable, "-c", _COMMIT_IN_A_WORKER, str(step)],
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        with bare_bridge(mine).batch(reads=["appended.t"]) as b:
            read_ts = b.read_ts
            _, files = b.files("appended.t")
        committed_ts = int(setup.committed_txn(writer.txn_id)["txn"]["ts"])
        assert read_ts >= committed_ts, "the batch read below the append's commit"
        assert [f["path"] for f in files] == [message.path]
    finally:
        mine.close()
        datasource.stop_session_keepers()
        setup.close()


# The commit step of a data source write, run the way Spark runs it: in another Python process.
_COMMIT_IN_A_WORKER = """
import pickle, sys
writer, message = pickle.loads(open(sys.argv[1], "rb").read())
writer.commit([message])
"""
