"""A backfill commits its swap only if the files it wrote hold the rows of the files it removes.

No Spark: a fake bridge whose batch pins the backfill version, lists one file lacking the
column and "reads" it as fewer rows than its entry records, as a session with
`spark.sql.files.ignoreCorruptFiles` / `ignoreMissingFiles` does with a damaged or vanished
file (optimize refused that already; the backfill removed the file anyway, and its rows were
gone at every later timestamp)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import backfill
from spark_bridge.backfill import BackfillError, run_backfill
from spark_bridge.files import DataFile
from tests.spark.backfill_job import COLUMN_C, FIELD_ID, JOB_ID, TS, job_at_backfill


class _Client:
    def __init__(self) -> None:
        self.clock = SimpleNamespace(now=lambda: TS + 1, physical_now_ms=lambda: TS >> 16)
        self.reported: list[dict[str, Any]] = []

    def job_show(self, job_id: int) -> dict[str, Any]:
        return job_at_backfill()

    def job_backfilled(self, job_id: int, **kw: Any) -> dict[str, Any]:
        self.reported.append(kw)
        return {"accepted": True}


class _Batch:
    def __init__(self, written_rows: int) -> None:
        self.pinned = {
            "ns.t": SimpleNamespace(
                version=4,
                write_columns=[
                    {"field_id": 1, "name": "x", "type": "INT", "nullable": True},
                    COLUMN_C,
                ],
                write_only=[COLUMN_C],
            )
        }
        self.written_rows = written_rows
        self.removed: list[str] = []
        self.read_ts = TS
        self.report = SimpleNamespace(commit_ts=TS + 2)

    def files(self, _table: str) -> tuple[str, list[dict[str, Any]]]:
        return "/wh/t", [{"path": "old.parquet", "size_bytes": 100, "row_count": 10}]

    def read_files(self, _location: str, _files: list[dict[str, Any]], _struct: Any) -> str:
        return "df"

    def write(self, _table: str, _df: Any) -> list[DataFile]:
        return [DataFile(path="new.parquet", size_bytes=90, row_count=self.written_rows)]

    def remove(self, _table: str, paths: list[str]) -> None:
        self.removed.extend(paths)


class _Bridge:
    def __init__(self, written_rows: int) -> None:
        self.client = _Client()
        self.batches: list[_Batch] = []
        self.commits = 0
        self.written_rows = written_rows

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[_Batch]:
        b = _Batch(self.written_rows)
        self.batches.append(b)
        yield b  # an exception inside the block means no commit, as in the real bridge
        self.commits += 1


@pytest.fixture(autouse=True)
def _footers(monkeypatch: pytest.MonkeyPatch) -> None:
    # old.parquet lacks the column; the file the backfill writes carries it.
    monkeypatch.setattr(
        backfill,
        "top_level_field_ids",
        lambda _loc, path: frozenset({1} if path == "old.parquet" else {1, FIELD_ID}),
    )


def test_a_file_spark_read_short_is_not_removed_by_the_backfill() -> None:
    bridge = _Bridge(written_rows=0)  # the damaged file was skipped: no rows read
    with pytest.raises(BackfillError, match="rows") as caught:
        run_backfill(bridge, JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert caught.value.details["rows_expected"] == 10
    assert caught.value.details["rows_read"] == 0
    assert bridge.commits == 0, "the swap was committed: the file's rows are gone"
    assert bridge.client.reported == []


def test_a_backfill_that_kept_every_row_commits_and_reports() -> None:
    bridge = _Bridge(written_rows=10)
    result = run_backfill(bridge, JOB_ID, timeout_s=5)  # type: ignore[arg-type]
    assert result.files_rewritten == 1 and bridge.commits == 1
    assert bridge.batches[0].removed == ["old.parquet"]
    assert bridge.client.reported == [{"snapshot_ts": TS, "files_rewritten": 1}]
