"""The leader's schema change job worker: takes each running job to its next step when it may.

It decides nothing on its own. Every few hundred milliseconds it asks `metastore.jobs.
next_step_wait` what each running job waits for (its last version to activate everywhere, the
leases in the way, a backfill) and proposes `AdvanceSchemaJob(job_id, step)` for the jobs that
wait for nothing. Apply checks the gate and the backfill again and compares the step, so a
proposal that raced a lease, or a duplicate from a deposed leader, changes nothing. The job
lives in the replicated state, so a new leader (after a kill -9 of the old one, or of every
node) simply carries on from the step the log holds.
"""

from __future__ import annotations

import asyncio
import logging

from hlc import HybridClock
from hlc.limits import LOGICAL_BITS
from metastore.commands import AdvanceSchemaJob, encode_command
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.errors import MetastoreError
from metastore.jobs import next_step_wait
from metastore.outcome import Outcome
from raft.core.errors import RaftCoreError
from raft.errors import RaftError
from raft.node import RaftNode

log = logging.getLogger("metastore.jobs")

# How often the leader looks at the running jobs. A step waits at least DD + CSmax anyway.
JOB_POLL_INTERVAL_S = 0.2
PROPOSE_TIMEOUT_MS = 10_000


class JobWorker:
    def __init__(self, *, raft: RaftNode, sm: CatalogStateMachine, clock: HybridClock) -> None:
        self.raft = raft
        self.sm = sm
        self.clock = clock
        # job id -> the last wait reason logged, so a long wait is logged once, not every poll;
        # only running jobs (MAX_RUNNING_SCHEMA_JOBS at most): `step_once` drops the others.
        self._logged: dict[int, str] = {}

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(JOB_POLL_INTERVAL_S)
            if not (self.raft.is_leader() and self.raft.ready_to_serve):
                continue
            try:
                await self.step_once()
            except (MetastoreError, RaftError, RaftCoreError) as exc:
                # RaftCoreError: leadership moved mid-proposal (NotLeader, ProposalDropped).
                log.info("schema job step will be retried: %s", exc)

    async def step_once(self) -> int:
        """Propose the next step of every running job that waits for nothing; how many."""
        state = self.sm.state
        if state.cluster is None:
            return 0
        cs_max = state.cluster.cs_max_ms << LOGICAL_BITS
        proposed = 0
        running = state.jobs.jobs(running_only=True)
        # Forget jobs that ended without this worker (cancelled, aborted, advanced by another
        # leader): their entries would stay for the life of the process.
        ids = {job.job_id for job in running}
        for job_id in [j for j in self._logged if j not in ids]:
            del self._logged[job_id]
        for job in running:
            wait = next_step_wait(
                job,
                catalog=state.catalog,
                sessions=state.sessions,
                now_tm=self.clock.now(),
                cs_max=cs_max,
            )
            if wait.reason:
                if wait.reason != "activation" and self._logged.get(job.job_id) != wait.message:
                    self._logged[job.job_id] = wait.message
                    log.info(
                        "schema job waits",
                        extra={"job_id": job.job_id, "step": job.step_name, "for": wait.message},
                    )
                continue
            cmd = AdvanceSchemaJob(job_id=job.job_id, step=job.step)
            res = await self.raft.propose(encode_command(cmd), timeout_ms=PROPOSE_TIMEOUT_MS)
            outcome = res.result
            proposed += 1
            if isinstance(outcome, Outcome) and not outcome.ok:
                # A lease acquired or an old write committed between our check and the entry:
                # apply refused it; the next poll sees why.
                log.info(
                    "schema job step refused",
                    extra={"job_id": job.job_id, "error": outcome.error},
                )
                continue
            self._logged.pop(job.job_id, None)
            after = self.sm.state.jobs.get(job.job_id)
            log.info(
                "schema job advanced",
                extra={"job_id": job.job_id, "step": after.step_name, "status": after.status},
            )
        return proposed
