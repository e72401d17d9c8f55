"""A driver process that dies between writing a batch's files and committing them.

    python -m tests.spark.driver_until_killed --endpoints h:p,h:p --token-file F \\
        --txn-id ID --rows N ns.a ns.b

It pins every table at one Top (with `--lease-ttl-ms`, under a metastore session with that TTL,
leasing the pinned versions as the bridge does, and heartbeating until killed), writes N rows
per table as Parquet into a fresh attempt directory (the bridge's `new_attempt_dir` /
`collect_files`, pyarrow standing in for Spark's executors: a SparkSession would cost this
process 10-15 s), prints one JSON line `{"pid", "top", "txn_id", "files": {table: [relative
paths]}, "session_id", "versions"}` and then blocks where the bridge would send the commit,
until the test SIGKILLs it. Not killed within BLOCK_S, it exits with status 3 without
committing, so a broken test cannot leave it running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from metastore.client import SyncMetastoreClient
from spark_bridge.files import collect_files, new_attempt_dir
from spark_bridge.session import BridgeSession
from tests.spark.support import write_parquet

BLOCK_S = 60.0
EXIT_NOT_KILLED = 3


def _row(columns: list[dict[str, Any]], i: int) -> dict[str, Any]:
    return {c["name"]: (f"r{i}" if c["type"] == "STRING" else i) for c in columns}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--txn-id", required=True)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--lease-ttl-ms", type=int, default=None)
    parser.add_argument("tables", nargs="+")
    args = parser.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    with SyncMetastoreClient(args.endpoints.split(","), token) as client:
        top = client.clock.now()
        session_id = None
        pins: dict[str, dict[str, Any]] = {}
        if args.lease_ttl_ms is not None:
            session = BridgeSession(
                client, app_id="killed-driver", app_name="killed", ttl_ms=args.lease_ttl_ms
            )
            session_id = session.current()
            r = client.pin(list(args.tables), top, session_id=session_id)
            pins = {p["table"]: p for p in r["pins"]}
        files: dict[str, list[str]] = {}
        for table in args.tables:
            pinned = pins.get(table) or client.schema_at(table, ts=top)
            location = str(pinned["location"])
            _, rel_dir = new_attempt_dir(location, args.txn_id, owner=session_id or "")
            columns = pinned["schema"]["columns"]
            write_parquet(location, rel_dir, columns, [_row(columns, i) for i in range(args.rows)])
            files[table] = [f.path for f in collect_files(location, rel_dir)]
        line = {
            "pid": os.getpid(),
            "top": top,
            "txn_id": args.txn_id,
            "files": files,
            "session_id": session_id,
            "versions": {t: p["version"] for t, p in pins.items()},
        }
        print(json.dumps(line), flush=True)
        # Where the bridge would now send `commit`: wait to be killed.
        time.sleep(BLOCK_S)
    return EXIT_NOT_KILLED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
