"""`metastore cluster up` with a port of the cluster taken by another process, or a node's log
file that cannot be opened, starts nothing.

Before, `cluster up` started every node; the one whose port was taken exited (ADDRESS_IN_USE)
and `cluster up` failed with NODE_EXITED while the other nodes kept running in the background
(a half-started cluster to stop by hand); likewise for a log file it could not open. Now the
ports of the nodes it would start are tried, and their data directories and log files made
and opened, first: a failure is refused by name before any node starts.
"""

from __future__ import annotations

import fcntl
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.daemon.config import load_cluster_config
from tests.cli.real_cluster import free_base_port, kill_leftover_nodes
from tests.daemon.harness import run_cli


@pytest.fixture
def config_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    done = run_cli(
        "cluster", "init", str(directory), "--cluster-id", "ports",
        "--base-port", str(free_base_port()),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    try:
        yield directory
    finally:
        run_cli("cluster", "down", "--config", str(directory), "--grace-ms", "3000")
        kill_leftover_nodes(directory)


@pytest.mark.parametrize("which", ["raft_port", "client_port", "metrics_port"])
def test_a_taken_port_is_named_and_nothing_starts(config_dir: Path, which: str) -> None:
    config = load_cluster_config(config_dir / "cluster.toml")
    port = getattr(config.node(2), which)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        done = run_cli("cluster", "up", "--config", str(config_dir), "--wait-ms", "20000")
    assert done.returncode == 5, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: PORT_IN_USE: "), done.stderr
    assert f"127.0.0.1:{port}" in errors[0] and "node 2" in errors[0], errors[0]
    assert "started node" not in done.stderr, done.stderr
    assert not any(config.node_pid_file(n).exists() for n in config.node_ids)


def test_a_node_log_that_cannot_be_opened_is_named_and_nothing_starts(config_dir: Path) -> None:
    # Before: nodes 1 and 2 started, then IO_ERROR for node 3's log, with nodes 1 and 2 left
    # running in the background and not a word about them.
    config = load_cluster_config(config_dir / "cluster.toml")
    config.node_log_file(3).mkdir(parents=True)  # a directory where node 3's log file goes
    done = run_cli("cluster", "up", "--config", str(config_dir), "--wait-ms", "20000")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: DATA_DIR_UNUSABLE: "), done.stderr
    assert "node 3" in errors[0] and str(config.node_log_file(3)) in errors[0], errors[0]
    assert "Is a directory (EISDIR)" in errors[0], errors[0]  # the errno's name, to search
    assert "nothing was started" in errors[0], errors[0]
    assert "started node" not in done.stderr, done.stderr
    assert not any(config.node_pid_file(n).exists() for n in config.node_ids)


@pytest.mark.parametrize(
    ("node_file_text", "words"),
    [
        ('cluster = "cluster.toml"\nnode_id = 3\nnodeid = 3\n', "nodeid: unknown key"),
        ('cluster = "cluster.toml"\nnode_id = 2\n', "the file says node 2 but node 3"),
        ('cluster = "other/cluster.toml"\nnode_id = 3\n', "another cluster file"),
    ],
    ids=["typo", "another node", "another cluster"],
)
def test_a_node_file_that_would_not_start_that_node_is_named_and_nothing_starts(
    config_dir: Path, node_file_text: str, words: str
) -> None:
    # Only cluster.toml was loaded; node3.toml was left to node 3 itself, which refused it
    # (or ran another node, or a node of another cluster) after nodes 1 and 2 had started.
    config = load_cluster_config(config_dir / "cluster.toml")
    other = config_dir / "other"
    other.mkdir()
    (other / "cluster.toml").write_text((config_dir / "cluster.toml").read_text())
    node_file = config_dir / "node3.toml"
    node_file.write_text(node_file_text)
    done = run_cli("cluster", "up", "--config", str(config_dir), "--wait-ms", "20000")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: CONFIG_INVALID: "), done.stderr
    assert str(node_file) in errors[0] and words in errors[0], errors[0]
    assert "started node" not in done.stderr, done.stderr
    assert not any(config.node_pid_file(n).exists() for n in config.node_ids)


def test_a_node_whose_tls_files_are_unusable_is_named_and_nothing_starts(tmp_path: Path) -> None:
    # The [tls] files were checked by each node at its start: node 3 without its key exited
    # after nodes 1 and 2 had started.
    directory = tmp_path / "tls-cluster"
    init = run_cli(
        "cluster", "init", str(directory), "--cluster-id", "tlsports", "--tls",
        "--base-port", str(free_base_port()),
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    try:
        config = load_cluster_config(directory / "cluster.toml")
        assert config.tls is not None
        key = config.tls.node_files(3).key_file
        key.unlink()
        done = run_cli("cluster", "up", "--config", str(directory), "--wait-ms", "20000")
        assert done.returncode == 2, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1, done.stderr
        assert errors[0].startswith("Error: TLS_CONFIG_INVALID: node 3: "), errors[0]
        assert str(key) in errors[0], errors[0]
        assert "started node" not in done.stderr, done.stderr
        assert not any(config.node_pid_file(n).exists() for n in config.node_ids)
    finally:
        run_cli("cluster", "down", "--config", str(directory), "--grace-ms", "3000")
        kill_leftover_nodes(directory)


def test_up_and_down_while_another_up_or_down_runs_are_refused(config_dir: Path) -> None:
    # Two `cluster up` at once (a script run twice, two terminals) both found no node running
    # and both started every node: the second set failed, but their PIDs replaced the first
    # set's in the pid files, so `cluster down` no longer found the nodes that ran.
    config = load_cluster_config(config_dir / "cluster.toml")
    config.data_dir.mkdir(parents=True, exist_ok=True)
    lock = config.data_dir / ".lifecycle.lock"  # processes.LIFECYCLE_LOCK_FILE
    with lock.open("a+") as held:  # what the other `cluster up` holds while it runs
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        up = run_cli("cluster", "up", "--config", str(config_dir), "--wait-ms", "20000")
        down = run_cli("cluster", "down", "--config", str(config_dir))
    for done in (up, down):
        assert done.returncode == 5, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and errors[0].startswith("Error: BUSY: "), done.stderr
    assert "started node" not in up.stderr, up.stderr
    assert not any(config.node_pid_file(n).exists() for n in config.node_ids)
    # Once it is released, they run.
    down = run_cli("cluster", "down", "--config", str(config_dir))
    assert down.returncode == 0, down.stderr


def test_a_new_cluster_on_taken_ports_is_told_the_init_that_moves_it(config_dir: Path) -> None:
    """`cluster init` gives every cluster the same default ports, so the README's second
    cluster collides with a running cluster_configs/local. A cluster with no state yet is
    told the `cluster init` that moves it to free ports, and that command works as shown."""
    import re
    import shlex

    config = load_cluster_config(config_dir / "cluster.toml")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", config.node(1).client_port))
        squatter.listen()
        done = run_cli("cluster", "up", "--config", str(config_dir), "--wait-ms", "20000")
    assert done.returncode == 5, done.stderr
    match = re.search(r"`metastore (cluster init [^`]*)`", done.stderr)
    assert match, done.stderr
    words = shlex.split(match.group(1))
    assert "--force" in words and str(config_dir) in words, words
    moved = run_cli(*words)
    assert moved.returncode == 0, moved.stderr
    new = load_cluster_config(config_dir / "cluster.toml")
    assert new.node(1).client_port != config.node(1).client_port
    assert new.cluster_id == config.cluster_id
