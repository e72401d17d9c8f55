"""`metastore cluster down` stops a healthy cluster at once: its leader does not try to hand
leadership over to followers that are stopping with it.

Before, `cluster down` sent every node SIGTERM, the signal of a single node's planned stop (a
rolling restart), on which a leader first moves leadership to a voter, waiting up to one
election timeout. Its followers were stopping too, so the move could not succeed: every
`cluster down` (and every test teardown that uses it) waited out a whole election timeout, and
with an election timeout above --grace-ms the leader was SIGKILLed. Now `cluster down` sends
SIGINT, which stops a node without a hand-over; SIGTERM keeps it
(tests/daemon/test_graceful_leader_stop.py).

The cluster runs with a long election timeout, so the two cases are far apart: the old stop
took at least ELECTION_TIMEOUT_MS, the new one takes a few tens of milliseconds."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from metastore.daemon.config import load_cluster_config
from tests.cli.real_cluster import free_base_port, kill_leftover_nodes
from tests.daemon.harness import run_cli

ELECTION_TIMEOUT_MS: Final = 5_000
# Well under ELECTION_TIMEOUT_MS (what a hand-over that cannot succeed waits), and far above
# what stopping three idle nodes takes on a loaded machine.
DOWN_MAX_S: Final = ELECTION_TIMEOUT_MS / 1000 / 2


@pytest.fixture
def config_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    done = run_cli(
        "cluster", "init", str(directory), "--cluster-id", "down",
        "--base-port", str(free_base_port()),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cluster_file = directory / "cluster.toml"
    text, replaced = re.subn(
        r"(?m)^election_timeout_ms = \d+$",
        f"election_timeout_ms = {ELECTION_TIMEOUT_MS}",
        cluster_file.read_text(),
    )
    assert replaced == 1, "cluster init wrote no election_timeout_ms"
    cluster_file.write_text(text)
    try:
        yield directory
    finally:
        run_cli("cluster", "down", "--config", str(directory), "--grace-ms", "3000")
        kill_leftover_nodes(directory)


def _log_messages(log_file: Path) -> list[str]:
    messages = []
    for line in log_file.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            messages.append(str(json.loads(line).get("msg", "")))
    return messages


def test_cluster_down_stops_every_node_cleanly_without_waiting_for_a_hand_over(
    config_dir: Path,
) -> None:
    up = run_cli("cluster", "up", "--config", str(config_dir))
    assert up.returncode == 0, up.stdout + up.stderr
    config = load_cluster_config(config_dir / "cluster.toml")

    began = time.monotonic()
    down = run_cli("-o", "json", "cluster", "down", "--config", str(config_dir))
    took_s = time.monotonic() - began

    logs = {n.id: _log_messages(config.node_log_file(n.id)) for n in config.nodes}
    described = f"cluster down took {took_s:.2f} s: {down.stdout}{down.stderr}\nlogs: {logs}"
    assert down.returncode == 0, described
    assert [r["outcome"] for r in json.loads(down.stdout)] == ["stopped"] * 3, described
    assert took_s < DOWN_MAX_S, described
    for messages in logs.values():
        # A clean stop (serve() returns 0): asked for by SIGINT, stopped once, nothing fatal,
        # and no hand-over tried.
        stopping = messages.index("stopping on SIGINT")
        assert messages[stopping + 1 :].count("metastore node stopped") == 1, described
        assert not any(m.startswith("raft node stopping on a") for m in messages), described
        assert not any(m.startswith("handing leadership over") for m in messages), described
