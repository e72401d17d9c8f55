"""A `format("metastore")` append whose write stage starts more than a session TTL after the
write was planned (a long stage before it: a shuffle, a slow join) commits, against a real
3-node cluster on loopback.

The append's session is opened when the write is planned (`writer()`, on the driver side) and
its files go to that session's attempt directory. The tasks heartbeat it, but none runs during
the stages before the write, so nothing renewed it there: the session expired, the first write
task failed at its start (SessionNotFoundError) and the job's work was lost. The driver's
session keeper (spark_bridge.keeper, started by `register()`) heartbeats it from the planning
to the commit or abort.

No Spark job: the data source's steps are called as Spark calls them (the writer pickled
between the planning, the tasks and the commit), with the stage before the write simulated
by waiting three TTLs.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StructField, StructType

from metastore.client import SyncMetastoreClient
from spark_bridge import datasource
from tests.client.spark_task import write_rows
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

# A short session TTL for the cluster and the append. The cluster's lower bound is its session
# heartbeat (a third of the TTL) + 3 election timeouts: 500 + 900 <= 1,500 here. Shorter
# elections would churn leaders on a loaded machine.
TTL_MS = 1_500
CLUSTER = {
    "election_timeout_ms": 300,
    "heartbeat_interval_ms": 50,
    "session_ttl_ms": TTL_MS,
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[str], str, SyncMetastoreClient]]:
    with metastore_cluster(tmp_path, **CLUSTER) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        token = c.token("writer")
        client = SyncMetastoreClient(endpoints, token, client_name="long-stage-test")
        try:
            client.call("ddl", {"sql": "CREATE NAMESPACE ls"})
            location = tmp_path / "warehouse" / "t"
            client.call("ddl", {"sql": f"CREATE TABLE ls.t (id BIGINT) LOCATION '{location}'"})
            yield endpoints, token, client
        finally:
            client.close()


def _registered(endpoints: list[str], token: str) -> Any:
    """The data source class `register()` hands to Spark, with its driver-side upkeep."""
    registered: list[Any] = []
    spark = SimpleNamespace(dataSource=SimpleNamespace(register=registered.append))
    datasource.register(spark, endpoints=endpoints, token=token)  # type: ignore[arg-type]
    (source,) = registered
    return source


def _round_trip(value: Any) -> Any:
    """What Spark does between the planning, the tasks and the commit (separate processes)."""
    return pickle.loads(pickle.dumps(value))


def test_an_append_whose_write_stage_starts_after_a_ttl_commits(cluster: Any) -> None:
    endpoints, token, client = cluster
    source = _registered(endpoints, token)
    try:
        planned = source(options={"table": "ls.t", "session_ttl_ms": str(TTL_MS)})
        writer = _round_trip(planned.writer(StructType([StructField("id", LongType())]), False))
        # The stages before the write: no task of this write runs for three TTLs.
        time.sleep(3 * TTL_MS / 1000)
        message = write_rows(_round_trip(writer), [Row(id=1), Row(id=2)])
        _round_trip(writer).commit([message])
        files = client.files("ls.t")["files"]
        assert [f["path"] for f in files] == [message.path]
        ended = {e["session_id"]: e for e in client.session_list(include_ended=True)["ended"]}
        assert ended[writer.session_id]["reason"] == "closed"  # by the commit, not the TTL
        assert not list(Path(source.KEEPER_DIR).iterdir())  # the keeper keeps it no more
    finally:
        datasource.stop_session_keepers()
