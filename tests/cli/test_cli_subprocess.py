"""The CLI as a real process: `python -m cli.main` starts, prints help and initialises a cluster."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from metastore.daemon.config import load_cluster_config, load_node_config

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30


def metastore(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_help() -> None:
    done = metastore("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: metastore")
    for word in ("cluster", "node", "sql", "table", "ns", "safe-time", "Exit codes"):
        assert word in done.stdout


def test_cluster_init_into_a_fresh_directory(tmp_path: Path) -> None:
    target = tmp_path / "prod like"
    done = metastore(
        "-o",
        "json",
        "cluster",
        "init",
        str(target),
        "--nodes",
        "5",
        "--base-port",
        "29000",
        "--cluster-id",
        "sub",
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["cluster_id"] == "sub"
    assert len(doc["endpoints"]) == 5
    cfg = load_cluster_config(target / "cluster.toml")
    assert [n.client_port for n in cfg.nodes] == [29101, 29102, 29103, 29104, 29105]
    assert load_node_config(target / "node5.toml").node.metrics_port == 29205
    assert stat.S_IMODE((target / "secrets" / "admin.token").stat().st_mode) == 0o600
    again = metastore("cluster", "init", str(target))
    assert again.returncode == 5
    assert again.stderr.startswith("Error: ALREADY_EXISTS: ")


def test_usage_error_exit_code() -> None:
    done = metastore("table", "describe")
    assert done.returncode == 2
    assert "Missing argument" in done.stderr
