"""The node process freezes the catalog out of the garbage collector's scans
(metastore.daemon.collector), and doing so leaks nothing.

The workload runs in a child process: freezing is process-wide, and the test process's own heap
must not take part in it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from metastore.daemon import node as daemon_node
from tests.daemon.harness import REPO, write_cluster

ROUNDS = 6
CHILD_TIMEOUT_S = 240


def test_the_node_process_freezes_its_heap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`metastore node start` (run_node) serves with the heap frozen; in-process nodes don't."""
    config = write_cluster(tmp_path, n=1)
    seen: dict[str, object] = {}

    async def recording(_settings: object, **kwargs: object) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(daemon_node, "setup_logging", lambda **_: None)  # no global handlers
    monkeypatch.setattr(daemon_node, "serve", recording)
    assert daemon_node.run_node(config, 1, bootstrap=True) == 0
    assert seen.get("freeze_heap") is True, seen


def _workload() -> None:
    """Child process: a state machine with the node process's hook; rounds of commits, an
    overwrite, a table created and dropped, a snapshot taken and the base state restored.
    Prints, per round, the frozen object count after the round, and whether a cycle of
    objects frozen while alive was reclaimed after it was dropped."""
    from bench.bench_apply import TABLE, Node, big_commit
    from metastore.commands import DropTable, TableName
    from metastore.daemon.collector import refreeze
    from metastore.ddl import parse_ddl

    class Cyclic:
        def __init__(self) -> None:
            self.me = self

    node = Node()
    node.machine.on_state_settled = refreeze
    node.fill(20_000, 2_000)
    base = node.machine.snapshot()
    assert gc.get_freeze_count() > 0, "a snapshot taken freezes the heap"
    report: dict[str, list[int] | list[bool] | int] = {"frozen": [], "cycle_freed": []}
    for _ in range(ROUNDS):
        node.machine.restore(base)
        held = Cyclic()  # alive at the next freeze, dropped after it: cyclic garbage, frozen
        held_ref = weakref.ref(held)
        node.fill(6_000, 2_000)
        node.apply(big_commit("overwrite", node.index, 500))
        other = TableName.of(TABLE.namespace, "scratch")
        node.apply(parse_ddl(f"CREATE TABLE {other} (id BIGINT)"))
        node.apply(DropTable(table=other))
        node.machine.snapshot()  # refreezes with `held` alive
        del held
        node.machine.restore(base)  # refreezes: the frozen cycle is collected now
        assert isinstance(report["frozen"], list) and isinstance(report["cycle_freed"], list)
        report["frozen"].append(gc.get_freeze_count())
        report["cycle_freed"].append(held_ref() is None)
    # The state itself forms no cycles: a replaced state is freed by reference counts alone.
    node.machine.on_state_settled = None
    gc.unfreeze()
    gc.collect()
    gc.disable()
    node.machine.restore(base)
    report["unreachable_after_replace"] = gc.collect()
    print(json.dumps(report))


def test_frozen_heap_stays_bounded_through_commits_drops_snapshots_and_restores() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run(
        [sys.executable, "-c", "from tests.daemon.test_collector import _workload; _workload()"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    frozen = report["frozen"]
    # The same base state after every round: the frozen count does not grow with the rounds
    # (a few objects of slack: interned names, caches filled once).
    assert max(frozen[1:]) <= frozen[0] + 200, frozen
    assert all(report["cycle_freed"]), report
    assert report["unreachable_after_replace"] == 0, report
