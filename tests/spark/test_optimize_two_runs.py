"""Two `table optimize` runs of one table: the one that keeps losing its chunks still ends well.

No Spark: a fake bridge where "another optimize" commits the very chunk this run planned just
before this run's commit, every time (DATA_FILE_CONFLICT, retryable). Before, a run failed
after `ATTEMPTS_MAX` refusals in a row (exit 5) although the table was being optimized fine by
the other. A refusal after which fewer of the run's small files are left than at the previous
one is progress and costs no attempt; the run's files only shrink (it takes only those small at
its first listing), so this stays bounded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import optimize as optimize_module
from spark_bridge.bridge import BatchError
from spark_bridge.files import DataFile
from spark_bridge.optimize import optimize

TABLE = "ns.t"
TS = 117_000_000_000_000_000
SMALL_FILES = 2 * (optimize_module.ATTEMPTS_MAX + 2)  # chunks of 2: more chunks than attempts


class _Df:
    def coalesce(self, _n: int) -> _Df:
        return self


class _Bridge:
    def __init__(self, *, progress: bool = True) -> None:
        self.client = SimpleNamespace(clock=SimpleNamespace(now=lambda: TS))
        self.live = [
            {"path": f"small-{i}.parquet", "size_bytes": 100, "row_count": 1}
            for i in range(SMALL_FILES)
        ]
        self.batches = 0
        self.progress = progress

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[Any]:
        self.batches += 1
        assert self.batches <= 4 * SMALL_FILES, "the run never ends"
        planned: list[str] = []
        b = SimpleNamespace(
            pinned={TABLE: SimpleNamespace(write_columns=[])},
            files=lambda _t: ("/wh/t", list(self.live)),
            read_files=lambda _location, _files, _struct: _Df(),
            write=lambda _t, _df: [DataFile(path="mine.parquet", size_bytes=150, row_count=2)],
            remove=lambda _t, paths: planned.extend(paths),
            report=SimpleNamespace(commit_ts=TS + self.batches),
        )
        yield b
        if planned:
            # The other run commits the same chunk first: this commit is refused whole.
            if self.progress:
                gone = set(planned)
                theirs = {
                    "path": f"theirs-{self.batches}.parquet",
                    "size_bytes": 150,
                    "row_count": 2,
                }
                self.live = [f for f in self.live if f["path"] not in gone] + [theirs]
            raise BatchError("DATA_FILE_CONFLICT: removed meanwhile", retryable=True)


@pytest.fixture(autouse=True)
def _setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimize_module, "CHUNK_FILES_MAX", 2)
    monkeypatch.setattr(optimize_module, "RETRY_PAUSE_S", 0.0)


def test_a_run_that_loses_every_chunk_to_another_run_still_ends() -> None:
    bridge = _Bridge()
    result = optimize(bridge, TABLE, target_file_bytes=1024, min_files=2)  # type: ignore[arg-type]
    assert result.commits == 0 and result.attempts == SMALL_FILES // 2 + 1  # + the last listing
    assert not [f for f in bridge.live if f["path"].startswith("small-")]


def test_refusals_without_progress_still_end_the_run() -> None:
    bridge = _Bridge(progress=False)
    with pytest.raises(BatchError):
        optimize(bridge, TABLE, target_file_bytes=1024, min_files=2)  # type: ignore[arg-type]
    assert bridge.batches == optimize_module.ATTEMPTS_MAX
