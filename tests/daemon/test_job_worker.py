"""JobWorker (the leader's schema change job driver) with a stub Raft node and the real state
machine's state: nothing started, no cluster."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.commands import (
    AdvanceSchemaJob,
    CancelSchemaJob,
    CommitTxn,
    DataFile,
    TableName,
    TableWrite,
)
from metastore.daemon import job_worker
from metastore.daemon.job_worker import JobWorker
from raft.core.errors import NotLeaderError, ProposalDroppedError
from tests.daemon.loops import assert_keeps_running
from tests.metastore._driver import DD_MS, MS, Driver, ok

T = TableName.of("ns", "t")
SETTLE_MS = DD_MS + 1


class _Raft:
    def __init__(self) -> None:
        self.proposed: list[bytes] = []

    async def propose(self, data: bytes, *, timeout_ms: int) -> Any:
        self.proposed.append(data)
        raise AssertionError("nothing to propose: every job waits")


def _job_at_backfill(d: Driver, n: int) -> int:
    """A running ADD COLUMN job of table ns.t<n> that waits for a backfill."""
    table = TableName.of("ns", f"t{n}")
    d.ok(f"CREATE TABLE ns.t{n} (a INT)")
    d.tm += SETTLE_MS * MS
    ok(
        d,
        CommitTxn(
            txn_id=f"w{n}",
            writes=(
                TableWrite(
                    table=table,
                    schema_version=d.state.current(table).version,
                    add=(DataFile(path=f"f{n}.parquet", size_bytes=10, row_count=1),),
                ),
            ),
        ),
    )
    d.tm += SETTLE_MS * MS
    job_id = d.ok(f"ALTER TABLE ns.t{n} ADD COLUMN n INT NOT NULL DEFAULT 7")["job_id"]
    assert isinstance(job_id, int)
    for _ in range(2):  # write-only, then the backfill step
        step = d.state.jobs.get(job_id).step
        ok(d, AdvanceSchemaJob(job_id=job_id, step=step), step_ms=SETTLE_MS)
    return job_id


def test_the_wait_log_forgets_jobs_that_ended_without_this_worker() -> None:
    """A job cancelled (or aborted, or advanced by another leader) while it waited must leave
    the worker's "already logged" memory: it grew by one entry per such job, for ever."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    jobs = [_job_at_backfill(d, n) for n in range(3)]
    raft = _Raft()
    worker = JobWorker(
        raft=raft,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=d.state),  # type: ignore[arg-type]
        clock=HybridClock(ManualClock((d.tm >> 16) + 60_000)),
    )
    assert asyncio.run(worker.step_once()) == 0
    assert set(worker._logged) == set(jobs)  # each wait logged once
    for job_id in jobs[:2]:
        ok(d, CancelSchemaJob(job_id=job_id), step_ms=SETTLE_MS)
    assert asyncio.run(worker.step_once()) == 0
    assert set(worker._logged) == {jobs[2]}
    assert raft.proposed == []


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

    asyncio.run(assert_keeps_running(w.run_forever(), lambda: calls >= 4))
