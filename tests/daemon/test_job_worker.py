"""The leader's schema job worker loop (metastore/daemon/job_worker.py) with a stand-in Raft
node: no cluster, no processes."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest

from metastore.daemon import job_worker
from metastore.daemon.job_worker import JobWorker
from raft.core.errors import NotLeaderError, ProposalDroppedError


def test_a_leadership_change_mid_step_does_not_end_the_job_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The core raises NotLeader / ProposalDropped (not RaftErrors) when leadership moves while
    # a step's proposal is pending. The loop caught MetastoreError and RaftError only, so it
    # died: on that node no schema change job advanced again until a restart, even once it led
    # again (ALTERs running as jobs hung).
    monkeypatch.setattr(job_worker, "JOB_POLL_INTERVAL_S", 0.001)
    raft = SimpleNamespace(is_leader=lambda: True, ready_to_serve=True)
    w = JobWorker(raft=raft, sm=SimpleNamespace(), clock=SimpleNamespace())  # type: ignore[arg-type]
    errors = [NotLeaderError(2), ProposalDroppedError("entry 9 was replaced")]
    calls = 0

    async def step_once() -> int:
        nonlocal calls
        calls += 1
        raise errors[calls % 2]

    w.step_once = step_once  # type: ignore[method-assign]

    async def run() -> None:
        task = asyncio.create_task(w.run_forever())
        for _ in range(2_000):
            if calls >= 4 or task.done():
                break
            await asyncio.sleep(0.001)
        assert not task.done(), task.exception()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert calls >= 4
