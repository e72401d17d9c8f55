"""Two backfill runs of one job: the one that keeps losing its chunks to the other still ends.

No Spark: a fake bridge whose table has more chunks of files without the column than
`ATTEMPTS_MAX`, and "another run" that commits the very chunk this run planned just before
this run's commit, every time (DATA_FILE_CONFLICT, retryable). Before, each refusal counted
against the run's attempts, so the run failed with DATA_FILE_CONFLICT (exit 1) while the job
was being backfilled fine by the other. A refusal after which fewer files lack the column than
at the previous one is progress (by anyone) and costs no attempt; the count of such files only
falls (no writer without the column commits once the backfill step is active), so this stays
bounded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import backfill
from spark_bridge.backfill import REPORTED, run_backfill
from spark_bridge.bridge import BatchError
from spark_bridge.files import DataFile
from tests.spark.backfill_job import COLUMN_C, FIELD_ID, JOB_ID, TS, job_at_backfill

OLD_FILES = backfill.ATTEMPTS_MAX + 3


class _Client:
    def __init__(self) -> None:
        self.clock = SimpleNamespace(now=lambda: TS + 1, physical_now_ms=lambda: TS >> 16)
        self.reports: list[dict[str, Any]] = []

    def job_show(self, job_id: int) -> dict[str, Any]:
        return job_at_backfill()

    def job_backfilled(self, job_id: int, **kw: Any) -> dict[str, Any]:
        self.reports.append(kw)
        return {"job_id": job_id, "backfill_ts": kw["snapshot_ts"], "accepted": True}


class _Bridge:
    def __init__(self) -> None:
        self.client = _Client()
        self.live = [f"old-{i}.parquet" for i in range(OLD_FILES)]
        self.batches = 0

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[Any]:
        self.batches += 1
        assert self.batches <= 4 * OLD_FILES, "the run never ends"
        planned: list[str] = []
        b = SimpleNamespace(
            pinned={
                "ns.t": SimpleNamespace(version=4, write_columns=[COLUMN_C], write_only=[COLUMN_C])
            },
            files=lambda _t: (
                "/wh/t",
                [{"path": p, "size_bytes": 10, "row_count": 1} for p in self.live],
            ),
            read_files=lambda _location, _files, _struct: "df",
            write=lambda _t, _df: [
                DataFile(path=f"mine-{self.batches}.parquet", size_bytes=10, row_count=1)
            ],
            remove=lambda _t, paths: planned.extend(paths),
            read_ts=TS,
            report=SimpleNamespace(commit_ts=TS + self.batches),
        )
        yield b
        if planned:
            # The other run commits the same chunk first: this run's commit is refused whole.
            self.live = [p for p in self.live if p not in planned] + [
                f"theirs-{self.batches}.parquet"
            ]
            raise BatchError("DATA_FILE_CONFLICT: removed meanwhile", retryable=True)


@pytest.fixture(autouse=True)
def _setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "RETRY_PAUSE_S", 0.0)
    monkeypatch.setattr(backfill, "CHUNK_FILES_MAX", 1)
    monkeypatch.setattr(
        backfill,
        "top_level_field_ids",
        lambda _loc, path: frozenset({1} if path.startswith("old-") else {1, FIELD_ID}),
    )


def test_a_run_that_loses_every_chunk_to_another_run_still_reports() -> None:
    bridge = _Bridge()
    result = run_backfill(bridge, JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.outcome == REPORTED and result.files_rewritten == 0
    assert len(bridge.client.reports) == 1
    assert not [p for p in bridge.live if p.startswith("old-")]


def test_refusals_without_progress_still_end_the_run() -> None:
    bridge = _Bridge()

    def never_progresses(**_kw: Any) -> Any:
        raise BatchError("SCHEMA_VERSION_NOT_ACTIVE: re-plan", retryable=True)

    bridge.batch = never_progresses  # type: ignore[method-assign]
    with pytest.raises(BatchError):
        run_backfill(bridge, JOB_ID, timeout_s=5)  # type: ignore[arg-type]
