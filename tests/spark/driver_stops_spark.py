"""A Spark driver that opens a bridge (and so a metastore session), stops Spark, and stays alive.

    python -m tests.spark.driver_stops_spark --endpoints h:p,h:p --token-file F

Prints `{"session_id": ...}` once the bridge is up, then `{"stopped": true}` after
`spark.stop()`, then sleeps (at most LINGER_S) until the test kills it: the session must be
closed by spark.stop() itself, not by the interpreter's exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from spark_bridge.bridge import MetastoreBridge

LINGER_S = 60.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--token-file", required=True)
    args = parser.parse_args(argv)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("stop-hook")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    token = Path(args.token_file).read_text().strip()
    bridge = MetastoreBridge(spark, endpoints=args.endpoints.split(","), token=token)
    assert bridge.session is not None
    print(json.dumps({"session_id": bridge.session.current()}), flush=True)
    spark.stop()
    print(json.dumps({"stopped": True}), flush=True)
    time.sleep(LINGER_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
