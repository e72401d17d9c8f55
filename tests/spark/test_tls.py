"""The Spark bridge against a cluster whose peers and client ports speak TLS: a batch commits,
`read_table` and `format("metastore")` (which runs its client in Python workers) read it back,
all with the TLS options given once to the bridge."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.certs import generate_dev_certs
from metastore.errors import TlsRequiredError
from raft.tls import ClientTls
from spark_bridge.bridge import MetastoreBridge
from tests.daemon.harness import MetastoreCluster, write_cluster
from tests.daemon.harness import tls_cluster as new_tls_cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[MetastoreCluster, ClientTls]]:
    certs = generate_dev_certs(tmp_path_factory.mktemp("spark-tls"), node_ids=[1, 2, 3])
    cluster = new_tls_cluster(write_cluster(tmp_path_factory.mktemp("spark-tls-cluster"), 3), certs)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        yield cluster, ClientTls(ca_file=certs.ca_cert)
    finally:
        from spark_bridge.datasource import stop_session_keepers

        stop_session_keepers()  # started by the bridges' register()
        cluster.stop_all()


def test_a_bridge_with_tls_options_commits_and_reads(
    spark: SparkSession, tls_cluster: tuple[MetastoreCluster, ClientTls]
) -> None:
    cluster, tls = tls_cluster
    endpoints = [f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids]
    token = cluster.token("admin")
    # Without the TLS options the bridge cannot even open its session.
    with pytest.raises(TlsRequiredError):
        MetastoreBridge(spark, endpoints=endpoints, token=token, app_name="no-tls")
    with SyncMetastoreClient(endpoints, token, tls=tls) as client:
        client.ddl("CREATE NAMESPACE tls_spark")
        client.ddl("CREATE TABLE tls_spark.t (id BIGINT NOT NULL, name STRING)")
    bridge = MetastoreBridge(spark, endpoints=endpoints, token=token, app_name="tls", tls=tls)
    try:
        rows = [(1, "a"), (2, "b"), (3, "c")]
        with bridge.batch(writes=["tls_spark.t"]) as b:
            b.write("tls_spark.t", spark.createDataFrame(rows, "id BIGINT, name STRING"))
        assert b.report.commit_ts is not None
        got = sorted(tuple(r) for r in bridge.read_table("tls_spark.t").collect())
        assert got == rows
        via_source = spark.read.format("metastore").option("table", "tls_spark.t").load()
        assert sorted(tuple(r) for r in via_source.collect()) == rows
    finally:
        bridge.close()
