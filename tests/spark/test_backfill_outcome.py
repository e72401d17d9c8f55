"""What `run_backfill` (and `metastore job run-backfill`) says and does when the job is no longer
at its backfill step: it went public meanwhile (another run's report, or none was needed), it
was cancelled or is being cancelled, or its table was dropped. No Spark: a fake bridge whose
client answers `job_show` and whose batch pins the version the job's state implies.

Decided: a job that succeeded (before or while this run ran) is not an error: the result says
`outcome: job_succeeded` with a note, exit 0, since what the user asked for (the column
backfilled and public) is done; a cancelled, aborted or cancelling job is SCHEMA_JOB_STATE
(exit 5) naming what happened."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import backfill
from spark_bridge.backfill import JobNotBackfillableError, run_backfill

JOB_ID = 7
TS = 117_000_000_000_000_000


def _job(status: str, step: str, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": JOB_ID,
        "table": "ns.t",
        "kind": "add_column",
        "column": "c",
        "field_id": 3,
        "status": status,
        "step": step,
        "backfill_from_ts": 1,
        "backfill_ts": None,
        "backfill_needed": True,
        "files_rewritten": 0,
        "ended_by": "",
        "message": "",
        "cancel_requested": False,
        "waiting_for": None,
        **extra,
    }


AT_BACKFILL = _job("running", "backfill")
SUCCEEDED = _job("succeeded", "public", backfill_ts=TS, files_rewritten=4)
SUCCEEDED_NO_BACKFILL = _job("succeeded", "public", backfill_needed=False)
CANCELLED = _job("cancelled", "backfill", ended_by="alice@cli", message="cancelled by alice@cli")
CANCELLING = _job("running", "backfill", cancel_requested=True, ended_by="bob@cli")
ABORTED = _job("aborted", "backfill", message="its table was dropped")


class _FakeClient:
    def __init__(self, views: list[dict[str, Any]]) -> None:
        self.views = views  # job_show answers in turn; the last one repeats
        self.clock = SimpleNamespace(now=lambda: TS + 1, physical_now_ms=lambda: TS >> 16)

    def job_show(self, job_id: int) -> dict[str, Any]:
        assert job_id == JOB_ID
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def job_backfilled(self, job_id: int, **_kw: Any) -> dict[str, Any]:
        raise AssertionError("nothing to report: the job moved on")


class _FakeBridge:
    """Its batch pins a version that no longer holds the column write-only (the job moved on
    between the step check and the pin)."""

    def __init__(self, views: list[dict[str, Any]]) -> None:
        self.client = _FakeClient(views)

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[Any]:
        yield SimpleNamespace(
            pinned={"ns.t": SimpleNamespace(write_columns=[], write_only=[], version=5)}
        )


def _run(views: list[dict[str, Any]]) -> backfill.BackfillResult:
    said: list[str] = []
    try:
        return run_backfill(_FakeBridge(views), JOB_ID, timeout_s=5, progress=said.append)  # type: ignore[arg-type]
    finally:
        print(said)


def test_a_job_that_went_public_while_the_backfill_ran_is_success_not_cancelled() -> None:
    # At the backfill step when the run looked, public by the time it pinned (another run's
    # report was accepted and the job published the column).
    result = _run([AT_BACKFILL, SUCCEEDED])
    assert result.outcome == "job_succeeded"
    assert "succeeded" in result.note and "public" in result.note, result.note
    assert "cancel" not in result.note
    assert result.snapshot_ts == TS  # the accepted report's snapshot


def test_a_job_that_had_succeeded_before_the_run_is_success() -> None:
    result = _run([SUCCEEDED])
    assert result.outcome == "job_succeeded" and result.files_rewritten == 0
    assert result.snapshot_ts == TS


@pytest.mark.parametrize(
    ("view", "said"),
    [
        (CANCELLED, "was cancelled by alice@cli"),
        (CANCELLING, "is being cancelled"),
        (ABORTED, "its table was dropped"),
    ],
)
def test_a_job_that_will_not_publish_is_refused_naming_what_happened(
    view: dict[str, Any], said: str
) -> None:
    with pytest.raises(JobNotBackfillableError) as refused:
        _run([AT_BACKFILL, view])
    assert said in refused.value.message, refused.value.message
    assert refused.value.code == "SCHEMA_JOB_STATE"
    assert refused.value.details["status"] == view["status"]
    if view is not CANCELLED:
        assert "cancelled or has ended" not in refused.value.message


@pytest.mark.parametrize(
    ("view", "done", "words"),
    [
        (SUCCEEDED, True, ["succeeded", "column c of ns.t is public", "reported at"]),
        (SUCCEEDED_NO_BACKFILL, True, ["succeeded", "needed no backfill"]),
        (CANCELLED, False, ["was cancelled by alice@cli", "at step backfill", "not added"]),
        (CANCELLING, False, ["is being cancelled", "bob@cli"]),
        (ABORTED, False, ["was aborted", "its table was dropped"]),
        (_job("running", "write_only"), False, ["at step write_only"]),
        (AT_BACKFILL, False, ["still at its backfill step", "run the backfill again"]),
    ],
)
def test_job_end_names_what_happened(view: dict[str, Any], done: bool, words: list[str]) -> None:
    end = backfill.job_end(view)
    assert end.done is done
    for word in words:
        assert word in end.message, (word, end.message)
