"""`bench.bench_loop_stall` runs end to end in its quick mode: every operation, every round.
Only the structure is checked, never a time."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_loop_stall


def test_the_loop_stall_bench_measures_every_operation(tmp_path: Path) -> None:
    assert bench_loop_stall.main(["--quick", "--rounds", "1", "--results-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("loop-stall-*.json")
    report = json.loads(out.read_text())
    assert report["entries"] == bench_loop_stall.QUICK_ENTRIES
    assert set(report["results"]) == set(bench_loop_stall.OPERATIONS)
    for rounds in report["results"].values():
        assert len(rounds) == 1
        assert all(r["worst_turn_s"] >= 0 and r["wall_s"] > 0 for r in rounds)
