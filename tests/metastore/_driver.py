"""A driver that feeds commands to a MetastoreState with increasing Tm and index, like Raft."""

from __future__ import annotations

from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import AdvanceSchemaJob, Command, InitCluster
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.outcome import Outcome
from metastore.state import MetastoreState

MS = 1 << 16  # one millisecond in HLC units
DD_MS = 500
CS_MAX_MS = 100
DD = DD_MS * MS
T0 = 1_764_000_000_000 * MS  # a realistic Tm


class Driver:
    """Applies commands to a state with strictly increasing Tm and index, like Raft."""

    def __init__(
        self,
        *,
        dd_ms: int = DD_MS,
        cs_max_ms: int = CS_MAX_MS,
        apply_version: int = APPLY_VERSION_SUPPORTED,
    ) -> None:
        """A new cluster, at the newest apply version unless told (metastore.apply_version)."""
        self.state = MetastoreState()
        self.tm = T0
        self.index = 0
        init = InitCluster(dd_ms=dd_ms, cs_max_ms=cs_max_ms, apply_version=apply_version)
        self.apply(init).raise_for_error()

    def apply(self, cmd: Command, *, step_ms: int = 1) -> Outcome:
        self.tm += step_ms * MS
        self.index += 1
        return self.state.apply(cmd, tm=self.tm, index=self.index)

    def sql(self, text: str, *, request_id: str = "", step_ms: int = 1) -> Outcome:
        return self.apply(parse_ddl(text, request_id=request_id), step_ms=step_ms)

    def ok(self, text: str, *, request_id: str = "", step_ms: int = 1) -> dict[str, object]:
        outcome = self.sql(text, request_id=request_id, step_ms=step_ms)
        outcome.raise_for_error()
        return outcome.result

    def finish_jobs(self, *, step_ms: int = DD_MS + 1) -> None:
        """Take every running schema change job to its end, as the leader's job worker does
        (each step after the previous one activated; a needed backfill must be reported)."""
        for _ in range(100):
            running = self.state.jobs.jobs(running_only=True)
            if not running:
                return
            for job in running:
                self.apply(AdvanceSchemaJob(job_id=job.job_id, step=job.step), step_ms=step_ms)
                self.state.check_invariants()
        raise AssertionError(f"jobs still running: {self.state.jobs.jobs(running_only=True)}")


def ok(d: Driver, cmd: Command, *, step_ms: int = 1) -> dict[str, object]:
    """Apply `cmd`, which must succeed and keep every invariant; its result."""
    outcome = d.apply(cmd, step_ms=step_ms)
    outcome.raise_for_error()
    d.state.check_invariants()
    return outcome.result


def refused(
    d: Driver, cmd: Command, error: type[MetastoreError], *, step_ms: int = 1
) -> MetastoreError:
    """Apply `cmd`, which must fail with `error` and leave the state exactly as it was."""
    before = d.state.to_snapshot()
    outcome = d.apply(cmd, step_ms=step_ms)
    exc = outcome.exception()
    assert isinstance(exc, error), outcome
    assert d.state.to_snapshot() == before
    d.state.check_invariants()
    return exc
