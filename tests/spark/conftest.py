"""Real Spark against a real 3-node metastore cluster: the Spark bridge's guarantees end to end.

One SparkSession (local[2]) for the whole run, because starting one costs 10-15 s; each module
starts its own cluster (`spark_env`), so a module that kills nodes cannot disturb another.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from spark_bridge.bridge import ensure_python_workers
from tests.daemon.harness import metastore_cluster
from tests.spark.support import SparkEnv

# The Python workers' TZ (see the session fixture): UTC-3:30 in winter, -2:30 in summer.
WORKER_TZ = "America/St_Johns"

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Python workers (data source, UDF-free reads) must run this interpreter.
    ensure_python_workers()
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("spark-bridge-tests")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        # Python workers (the data source's tasks) in a zone with a half-hour offset and
        # daylight saving, while the driver and the JVM stay in the machine's zone: PySpark
        # gives a worker TIMESTAMP values in the worker's local time, so a conversion that
        # assumes UTC shows here even on a CI machine running in UTC.
        .config("spark.executorEnv.TZ", WORKER_TZ)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # py4j logs every callback connection at INFO; the streaming tests make many.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark_env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    with metastore_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        cluster.start_all()
        cluster.wait_ready()
        env = SparkEnv(cluster, spark)
        try:
            yield env
        finally:
            env.close()
