"""A leader's GC run across a change of leader (metastore/daemon/gc_worker.py): its first run
must not stall the event loop long enough to lose the leadership, and a proposal a newer leader
replaced ends the run with UNAVAILABLE (outcome unknown), never NOT_LEADER: with five voters
another node may still hold the entry and commit it as the next leader, so "nothing of it
applied" cannot be said. The client repeats `gc run` on an unknown outcome (a run is safe to
repeat), so the user's `gc run` still ends at the new leader.

Seen on a loaded machine in tests/daemon/test_gc.py: the first `gc run` imported pyarrow on
the leader's event loop (0.2 to 1 s), the followers elected another leader meanwhile, and the
run's first AdvanceGcThreshold, appended by the old leader just before it stepped down, came
back as "GC proposal failed: proposal dropped: entry 22 was replaced by a newer leader"."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from metastore.daemon.gc_worker import GcWorker
from metastore.errors import UnavailableError
from raft.core.errors import ProposalDroppedError
from tests.daemon.test_gc_orphans import _Raft, table_driver, worker
from tests.metastore._driver import MS, Driver

REPO_ROOT = Path(__file__).resolve().parents[2]


class _DroppingRaft(_Raft):
    """Every proposal is dropped; with `deposed`, because a newer leader replaced the entry
    (this node follows it by the time the proposer hears), else while this node still leads
    (back-pressure: too many bytes appended but not committed)."""

    ready_to_serve = True

    def __init__(self, d: Driver, *, deposed: bool) -> None:
        super().__init__(d)
        self.deposed = deposed

    def is_leader(self) -> bool:
        return self.leading

    async def propose(self, data: bytes, *, timeout_ms: int) -> SimpleNamespace:
        if self.deposed:
            self.leading = False
            raise ProposalDroppedError("entry 22 was replaced by a newer leader")
        raise ProposalDroppedError("1000 bytes appended but not yet committed (limit 1000)")


def _run_worker(d: Driver, raft: _Raft) -> GcWorker:
    w = worker(d, now_tm=d.tm)
    w.raft = raft  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    w.metrics = SimpleNamespace(gc_run=lambda summary: None, protections_held=lambda held: None)  # type: ignore[assignment]
    return w


def test_a_proposal_a_newer_leader_replaced_leaves_the_outcome_unknown(tmp_path: Path) -> None:
    # Not NOT_LEADER ("nothing done"): the entry may still commit through another voter.
    d = table_driver(tmp_path / "t")
    w = _run_worker(d, _DroppingRaft(d, deposed=True))
    with pytest.raises(UnavailableError, match="replaced by a newer leader"):
        asyncio.run(w.run(None, dry_run=False))


def test_a_proposal_dropped_while_still_leading_stays_unavailable(tmp_path: Path) -> None:
    # Not "ask another node": this node leads; its log is just full for now.
    d = table_driver(tmp_path / "t")
    w = _run_worker(d, _DroppingRaft(d, deposed=False))
    with pytest.raises(UnavailableError, match="not yet committed"):
        asyncio.run(w.run(None, dry_run=False))


_FIRST_RUN = """
import asyncio, sys, tempfile, threading
from pathlib import Path

on_loop = []


class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow":
            on_loop.append(threading.current_thread() is threading.main_thread())
        return None


sys.meta_path.insert(0, Spy())
from tests.daemon.test_gc_leader_change import _run_worker
from tests.daemon.test_gc_orphans import _Raft, table_driver

assert "pyarrow" not in sys.modules, "imported before the run: nothing to check"
d = table_driver(Path(tempfile.mkdtemp()) / "t")
raft = _Raft(d)
raft.is_leader = lambda: True
raft.ready_to_serve = True
asyncio.run(_run_worker(d, raft).run(None, dry_run=False))
print(on_loop)
"""


def test_the_first_run_imports_pyarrow_off_the_event_loop() -> None:
    # A fresh interpreter: this one may have imported pyarrow already.
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_RUN],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[False]", out.stdout + out.stderr
