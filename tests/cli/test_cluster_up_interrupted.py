"""`metastore cluster up` interrupted during a cluster's first start, and the `cluster up` after.

Ctrl-C between two node starts leaves the nodes already started running (their own sessions)
with their identities, and the rest without any state. The next `cluster up` used to start
those without --bootstrap (the cluster is no longer new), so they refused to start for good
(`NODE_EXITED`: "start it once with --bootstrap", which `cluster up` had no way to do). Now the
interrupted run says what keeps running and what to run, a `cluster up` that would start a
node without state among nodes with state refuses before starting anything and names the
command, and that command (`--bootstrap N`) starts it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import processes
from cli.cluster import _nodes_to_bootstrap
from cli.errors import CliError
from metastore.daemon.config import load_cluster_config
from raft.node import IDENTITY_FILE
from raft.wal import SYNC_FAILED_FILE
from tests.cli.real_cluster import free_base_port, kill_leftover_nodes
from tests.daemon.harness import run_cli

IDENTITY_WAIT_S = 30.0


def _init(directory: Path, base_port: int = 24_000) -> Path:
    done = run_cli(
        "cluster", "init", str(directory), "--cluster-id", "upint", "--base-port", str(base_port)
    )
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture
def config_dir(tmp_path: Path) -> Iterator[Path]:
    directory = _init(tmp_path / "cluster", free_base_port())
    try:
        yield directory
    finally:
        run_cli("cluster", "down", "--config", str(directory), "--grace-ms", "3000")
        kill_leftover_nodes(directory)


@pytest.mark.slow
def test_an_interrupted_first_start_says_what_to_run_and_that_runs(
    config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = processes.start_node

    def ctrl_c_before_node_3(node_id: int, *args: Any, **kwargs: Any) -> Any:
        if node_id == 3:
            raise KeyboardInterrupt  # what Ctrl-C raises in the CLI between two starts
        return real_start(node_id, *args, **kwargs)

    monkeypatch.setattr(processes, "start_node", ctrl_c_before_node_3)
    first = run_cli("cluster", "up", "--config", str(config_dir))
    monkeypatch.undo()
    go_on = f"metastore cluster up --missing --bootstrap 3 --config {config_dir}"
    assert first.returncode == 1, first.stderr
    assert "INTERRUPTED" in first.stderr and "keep(s) running" in first.stderr, first.stderr
    assert "node 1 (pid" in first.stderr and "node 2 (pid" in first.stderr, first.stderr
    assert go_on in first.stderr, first.stderr

    # Nodes 1 and 2 made their identities (they run), node 3 has no state.
    data = config_dir / "data"
    deadline = time.monotonic() + IDENTITY_WAIT_S
    while not all((data / f"node-{n}" / IDENTITY_FILE).exists() for n in (1, 2)):
        assert time.monotonic() < deadline, "nodes 1 and 2 did not start"
        time.sleep(0.1)

    # What ALREADY_RUNNING suggests: refused before starting anything, naming the command.
    missing = run_cli("cluster", "up", "--missing", "--config", str(config_dir))
    assert missing.returncode == 5, missing.stderr
    assert "NOT_BOOTSTRAPPED" in missing.stderr and go_on in missing.stderr, missing.stderr
    assert not (data / "node-3" / "node.pid").exists()

    done = run_cli(*go_on.split()[1:], "-o", "json")
    assert done.returncode == 0, done.stderr
    assert "started node 3" in done.stderr
    statuses = [d["result"] for d in json.loads(done.stdout)]
    assert sorted(s["node_id"] for s in statuses if s and s["ready"]) == [1, 2, 3], statuses


def _give_state(config_dir: Path, *node_ids: int) -> None:
    for n in node_ids:
        node_dir = config_dir / "data" / f"node-{n}"
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / IDENTITY_FILE).write_text("{}\n")


def _failed_first_start(config_dir: Path, node_id: int) -> None:
    """What a refused or interrupted first start leaves: a log file, an empty WAL."""
    wal = config_dir / "data" / f"node-{node_id}" / "wal"
    wal.mkdir(parents=True, exist_ok=True)
    (wal / "LOCK").touch()
    (wal / "wal-0000000000000001-0000000000000001.log").touch()
    (wal.parent / "node.log").write_text("refusing to start\n")


def _plan(config_dir: Path, asked: set[int], *, to_start: list[int] | None = None) -> set[int]:
    config = load_cluster_config(config_dir / "cluster.toml")
    return _nodes_to_bootstrap(config, config_dir, to_start or [1, 2, 3], asked, only_missing=False)


def test_a_new_cluster_bootstraps_every_node(tmp_path: Path) -> None:
    config_dir = _init(tmp_path / "c")
    assert _plan(config_dir, set()) == {1, 2, 3}
    _failed_first_start(config_dir, 2)  # a first start that failed everywhere is still new
    assert _plan(config_dir, set()) == {1, 2, 3}


def test_a_node_without_state_among_others_is_refused_with_the_command(tmp_path: Path) -> None:
    config_dir = _init(tmp_path / "c")
    _give_state(config_dir, 1, 2)
    _failed_first_start(config_dir, 3)
    with pytest.raises(CliError) as refused:
        _plan(config_dir, set())
    assert refused.value.code == "NOT_BOOTSTRAPPED"
    assert f"metastore cluster up --bootstrap 3 --config {config_dir}" in refused.value.message
    assert "remove-node" in refused.value.message  # the other possibility: data lost
    # Named: only that node starts as a first start.
    assert _plan(config_dir, {3}) == {3}
    # Restarting nodes with state never bootstraps them.
    _give_state(config_dir, 3)
    assert _plan(config_dir, set()) == set()


def test_a_majority_without_state_points_to_the_way_out_of_a_lost_quorum(
    tmp_path: Path,
) -> None:
    """Two of three data directories lost: removing and adding them back needs a quorum that
    the one node with state cannot form, so the error also names the way that works (an
    offline save of the survivor, restored into a new cluster), not only remove-node."""
    config_dir = _init(tmp_path / "c")
    _give_state(config_dir, 3)
    with pytest.raises(CliError) as refused:
        _plan(config_dir, set())
    assert refused.value.code == "NOT_BOOTSTRAPPED"
    message = refused.value.message
    assert "no quorum" in message
    assert f"snapshot save FILE --data-dir {config_dir / 'data' / 'node-3'}" in message
    assert "docs/operations.md" in message
    # With a majority holding state the hint stays the one that works there.
    _give_state(config_dir, 2)
    with pytest.raises(CliError) as one_lost:
        _plan(config_dir, set())
    assert "--data-dir" not in one_lost.value.message


def test_bootstrap_refuses_a_node_with_state_or_not_started(tmp_path: Path) -> None:
    config_dir = _init(tmp_path / "c")
    _give_state(config_dir, 1, 2)
    with pytest.raises(CliError, match="already has state") as with_state:
        _plan(config_dir, {2, 3})
    assert with_state.value.code == "USAGE"
    with pytest.raises(CliError, match="running"):
        _plan(config_dir, {3}, to_start=[1, 2])
    with pytest.raises(CliError, match="not in the cluster"):
        _plan(config_dir, {9})


def test_a_first_start_whose_recovery_sync_failed_is_still_new(tmp_path: Path) -> None:
    # Its log refuses every start of that boot and leaves SYNC_FAILED (a few bytes naming the
    # boot), never a record: after the reboot it is still a first start, to be bootstrapped.
    config_dir = _init(tmp_path / "c")
    _failed_first_start(config_dir, 3)
    wal = config_dir / "data" / "node-3" / "wal"
    (wal / SYNC_FAILED_FILE).write_text("boot-id\nfdatasync of wal-1.log: Input/output error\n")
    assert not processes.node_has_state(wal.parent)
    assert _plan(config_dir, set()) == {1, 2, 3}


def test_a_wal_with_bytes_but_no_identity_is_state(tmp_path: Path) -> None:
    # A log from before identities: the node adopts it, so it is not a first start.
    config_dir = _init(tmp_path / "c")
    _give_state(config_dir, 1, 2)
    _failed_first_start(config_dir, 3)
    segment = config_dir / "data" / "node-3" / "wal" / "wal-0000000000000001-0000000000000001.log"
    segment.write_bytes(b"\x00" * 64)
    assert processes.node_has_state(segment.parent.parent)
    assert _plan(config_dir, set()) == set()
