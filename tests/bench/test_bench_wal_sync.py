"""`bench.bench_wal_sync` runs end to end on a tiny workload: both variants, real synced
appends in child processes, a results file with what the table shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_wal_sync


def test_a_tiny_run_measures_both_variants_and_writes_its_results(tmp_path: Path) -> None:
    status = bench_wal_sync.main(
        ["--appends", "20", "--rounds", "1", "--writers", "2", "--results-dir", str(tmp_path)]
    )
    assert status == 0
    (path,) = tmp_path.glob("walsync-*.json")
    doc = json.loads(path.read_text())
    assert doc["params"] == {"appends": 20, "rounds": 1, "writers": 2}
    for variant in bench_wal_sync.VARIANTS:
        result = doc["results"][variant]
        assert result["appends"] == 40  # 2 writers x 20 appends, each one timed
        assert 0 < result["p50_us"] <= result["p99_us"]
        assert result["voluntary_switches_per_append"] >= 0
        assert len(result["rounds"]) == 1


def test_a_writer_grows_its_file_only_without_preallocation(tmp_path: Path) -> None:
    from raft.wal import WAL_PREALLOCATE_BYTES

    for preallocate in (True, False):
        directory = tmp_path / str(preallocate)
        bench_wal_sync.run_writer(directory, 10, preallocate=preallocate)
        (segment,) = directory.glob("wal-*.log")
        size = segment.stat().st_size
        assert (size >= WAL_PREALLOCATE_BYTES) == preallocate


@pytest.mark.parametrize("flag", ["--appends", "--rounds", "--writers"])
def test_counts_below_one_are_refused(flag: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        bench_wal_sync.main([flag, "0", "--results-dir", str(tmp_path)])
    assert caught.value.code == 2
