"""`bridge.optimize` ends while a streaming writer keeps adding small files.

No Spark: a fake bridge whose every batch lists the table as a stream left it (two new small
files since the last listing) and "rewrites" a chunk by returning one file of its rows. Before,
each chunk listed the table again and took whatever small files it found, so against a writer
adding files at least as fast as `min_files` per chunk a run never ended (the module docstring
promised it would: "so a run ends"). Now a run rewrites only the files that were small at its
first listing; later ones wait for the next run."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_bridge import optimize as optimize_module
from spark_bridge.files import DataFile
from spark_bridge.optimize import optimize

TABLE = "ns.t"
TS = 117_000_000_000_000_000
BATCHES_MAX = 20  # a run that needs more never ends


class _Df:
    def coalesce(self, _n: int) -> _Df:
        return self


class _StreamedTable:
    """Live files; every listing first sees two more small files of a streaming writer."""

    def __init__(self, initial: int) -> None:
        self.names = itertools.count()
        self.live: list[dict[str, Any]] = [self._small() for _ in range(initial)]

    def _small(self) -> dict[str, Any]:
        return {"path": f"stream-{next(self.names)}.parquet", "size_bytes": 100, "row_count": 1}

    def listing(self) -> list[dict[str, Any]]:
        self.live += [self._small(), self._small()]
        return list(self.live)


class _Batch:
    def __init__(self, table: _StreamedTable, number: int) -> None:
        self.table = table
        self.number = number
        self.pinned = {TABLE: SimpleNamespace(write_columns=[])}
        self.report = SimpleNamespace(commit_ts=TS + number)
        self.removed: list[str] = []
        self.added: list[dict[str, Any]] = []

    def files(self, _table: str) -> tuple[str, list[dict[str, Any]]]:
        self.listed = self.table.listing()
        return "/wh/t", self.listed

    def read_files(self, _location: str, _files: list[dict[str, Any]], _struct: Any) -> _Df:
        return _Df()

    def write(self, _table: str, _df: Any) -> list[DataFile]:
        self.written = DataFile(
            path=f"optimized-{self.number}.parquet", size_bytes=150, row_count=0
        )
        return [self.written]

    def remove(self, _table: str, paths: list[str]) -> None:
        self.removed = paths
        rows = sum(f["row_count"] for f in self.listed if f["path"] in paths)
        self.added = [{"path": self.written.path, "size_bytes": 150, "row_count": rows}]


class _Bridge:
    def __init__(self, table: _StreamedTable) -> None:
        self.table = table
        self.client = SimpleNamespace(clock=SimpleNamespace(now=lambda: TS))
        self.batches = 0

    @contextlib.contextmanager
    def batch(self, **_kw: Any) -> Iterator[_Batch]:
        self.batches += 1
        assert self.batches <= BATCHES_MAX, "optimize never ends while a stream writes"
        b = _Batch(self.table, self.batches)
        yield b
        live = [f for f in self.table.live if f["path"] not in b.removed]
        self.table.live = live + b.added


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimize_module, "CHUNK_FILES_MAX", 2)
    # The fake's rewritten file holds the chunk's rows (the rows check of a real write).
    monkeypatch.setattr(optimize_module, "_check_rows_kept", lambda *_a: None)


def test_optimize_ends_while_a_stream_keeps_adding_small_files() -> None:
    table = _StreamedTable(initial=4)
    first_small = {f["path"] for f in table.live} | {"stream-4.parquet", "stream-5.parquet"}
    bridge = _Bridge(table)
    result = optimize(bridge, TABLE, target_file_bytes=1024, min_files=2)  # type: ignore[arg-type]
    assert bridge.batches <= 4
    assert result.files_rewritten == len(first_small) == 6
    live = {f["path"] for f in table.live}
    assert not live & first_small, "a file small at the first listing was left"
