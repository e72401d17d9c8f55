"""A backfill whose report's reply is lost (a leader change: UNAVAILABLE "outcome unknown", or
TIMEOUT) looks at the job instead of failing the run after all its rewriting.

No Spark: a fake bridge with nothing left to rewrite (the listing is empty) and a client whose
first `job_backfilled` fails as a leader change makes it fail. Before, the run ended in that
error (exit 1 with a traceback-free message, but the user had to run it again); now the report
is found accepted (the job's `backfill_ts` is the run's snapshot) or is sent again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.errors import UnavailableError
from spark_bridge import backfill
from spark_bridge.backfill import REPORTED, run_backfill
from tests.spark.backfill_job import COLUMN_C, JOB_ID, TS, job_at_backfill


class _Client:
    def __init__(self, *, first_report_applied: bool, show_failures: int = 0) -> None:
        self.clock = SimpleNamespace(now=lambda: TS + 1, physical_now_ms=lambda: TS >> 16)
        self.first_report_applied = first_report_applied
        self.reports: list[dict[str, Any]] = []
        self.accepted_ts: int | None = None
        # `job_show` fails (retryably) this many times once a report was sent.
        self.show_failures = show_failures
        self.shows = 0

    def job_show(self, job_id: int) -> dict[str, Any]:
        self.shows += 1
        if self.reports and self.show_failures > 0:
            self.show_failures -= 1
            raise UnavailableError("job_show failed on every endpoint: no leader")
        return job_at_backfill(self.accepted_ts)

    def job_backfilled(self, job_id: int, **kw: Any) -> dict[str, Any]:
        self.reports.append(kw)
        if len(self.reports) == 1:
            if self.first_report_applied:
                self.accepted_ts = kw["snapshot_ts"]
            raise UnavailableError(
                "job_backfilled: connection to 127.0.0.1:7001 failed after the request was "
                "sent (reset); its outcome is unknown",
                details={"outcome_unknown": True},
            )
        self.accepted_ts = kw["snapshot_ts"]
        return {"job_id": job_id, "backfill_ts": kw["snapshot_ts"], "accepted": True}


class _Bridge:
    def __init__(self, client: _Client) -> None:
        self.client = client

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[Any]:
        yield SimpleNamespace(
            pinned={
                "ns.t": SimpleNamespace(version=4, write_columns=[COLUMN_C], write_only=[COLUMN_C])
            },
            files=lambda _table: ("/wh/t", []),  # nothing lacks the column
            read_ts=TS,
        )


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "RETRY_PAUSE_S", 0.0)


def test_a_report_applied_before_its_reply_was_lost_is_success_reported_once() -> None:
    client = _Client(first_report_applied=True)
    result = run_backfill(_Bridge(client), JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.outcome == REPORTED and result.snapshot_ts == TS
    assert len(client.reports) == 1, "an accepted report was sent again"


def test_a_report_lost_before_it_was_applied_is_sent_again() -> None:
    client = _Client(first_report_applied=False)
    result = run_backfill(_Bridge(client), JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.outcome == REPORTED and result.snapshot_ts == TS
    assert len(client.reports) == 2 and client.accepted_ts == TS


def test_an_accepted_report_is_not_sent_again_when_the_job_cannot_be_read_at_once() -> None:
    """The report was applied, its reply lost, and the `job_show` that would have said so
    failed too (the same leader change): the run rewrote nothing more and reported again, and
    the job counted this run's files twice (`files_rewritten` adds up every report). The job
    is now read before any report is sent again."""
    client = _Client(first_report_applied=True, show_failures=1)
    result = run_backfill(_Bridge(client), JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.outcome == REPORTED and result.snapshot_ts == TS
    assert len(client.reports) == 1, "an accepted report was sent again"
    assert client.show_failures == 0


def test_a_lost_report_is_sent_again_once_the_job_can_be_read() -> None:
    client = _Client(first_report_applied=False, show_failures=2)
    result = run_backfill(_Bridge(client), JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.outcome == REPORTED and result.snapshot_ts == TS
    assert len(client.reports) == 2 and client.accepted_ts == TS
