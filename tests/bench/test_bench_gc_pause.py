"""`bench.bench_gc_pause` runs end to end in its quick mode: both modes, every collection
timed, the frozen mode refreezing at each snapshot. Only the structure is checked, never a
time."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_gc_pause


def test_the_gc_pause_bench_runs_both_modes(tmp_path: Path) -> None:
    argv = ["--quick", "--snapshot-every", "4", "--results-dir", str(tmp_path)]
    assert bench_gc_pause.main(argv) == 0
    (out,) = tmp_path.glob("gc-pause-*.json")
    report = json.loads(out.read_text())
    runs = {r["mode"]: r for r in report["runs"]}
    assert set(runs) == set(bench_gc_pause.MODES)
    for run in runs.values():
        assert run["files"] == 100_000 and sum(run["collections"].values()) > 0
        assert len(run["snapshot_encode_s"]) == 100_000 // 10_000 // 4
        assert run["rss_mib"] > 0
    assert runs["default"]["refreeze_s"] == [] and runs["default"]["frozen_objects"] == 0
    assert len(runs["frozen"]["refreeze_s"]) == 2 and runs["frozen"]["frozen_objects"] > 0
