"""`python -m metastore.daemon --config FILE [--node-id N]`: run one node in the foreground.

The same as `metastore node start`; kept so a node can start with nothing but the package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metastore.daemon.config import ConfigError
from metastore.daemon.node import run_node


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m metastore.daemon", description=__doc__)
    ap.add_argument("--config", type=Path, required=True, help="nodeN.toml, or cluster.toml")
    ap.add_argument("--node-id", type=int, help="required with a cluster.toml")
    ap.add_argument(
        "--bootstrap",
        action="store_true",
        help="first start of this member: create its identity in an empty data directory",
    )
    args = ap.parse_args(argv)
    try:
        return run_node(args.config, args.node_id, bootstrap=args.bootstrap)
    except ConfigError as exc:
        print(f"Error: {exc.code}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
