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


def test_an_os_error_is_one_error_line_not_a_traceback(tmp_path: Path) -> None:
    # A directory that cannot be created (its parent is a file): the OS refuses, the CLI says so.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = metastore("cluster", "init", str(blocker / "cluster"), "--cluster-id", "x")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error: IO_ERROR: "), done.stderr
    assert str(blocker / "cluster") in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path) -> None:
    # `metastore ... >&-` (a service manager or a script closing it): there is nowhere to print
    # the result; the command still does its work and exits 0.
    env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "init", str(tmp_path / "c")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c" / "cluster.toml").exists()
