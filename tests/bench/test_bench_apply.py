"""`bench.bench_apply` runs end to end in its quick mode: every (kind, table size) case is
measured for every round, and the JSON holds what the table printed. Only the structure is
checked, never a time."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_apply
from metastore import limits
from metastore.commands import encode_command


def test_the_apply_bench_measures_every_case(tmp_path: Path) -> None:
    assert bench_apply.main(["--quick", "--rounds", "2", "--results-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("apply-*.json")
    report = json.loads(out.read_text())
    params = bench_apply.Params.for_mode(quick=True, rounds=2)
    assert report["params"]["rounds"] == 2
    assert report["machine"]["loadavg_1_5_15_min"] is not None
    cases = {(c["kind"], c["table_files"]): c for c in report["cases"]}
    assert set(cases) == {(k, s) for k in bench_apply.KINDS for s in params.table_sizes}
    for (kind, size), case in cases.items():
        for series in ("wall_s", "cpu_s", "gc_s", "decode_s", "files_before", "live_removed"):
            assert len(case[series]) == 2, (kind, size, series)
        assert all(t >= 0 for t in case["wall_s"] + case["cpu_s"] + case["gc_s"])
        assert case["wall_median_s"] >= 0 and case["wall_max_s"] >= case["wall_median_s"]
        assert case["command_bytes"] > 0
        if kind == "add":  # the table grows by the commit, round after round
            step = params.files_per_commit
            assert case["files_before"] == [size, size + step]
        else:  # each round overwrites a freshly filled table: every live file goes
            assert case["files_before"] == [size, size]
            assert case["live_removed"] == [size, size]


def test_the_largest_commit_is_just_below_the_command_limit() -> None:
    for kind in bench_apply.KINDS:
        command = bench_apply.big_commit(kind, 7, limits.MAX_FILES_PER_COMMIT)
        size = len(encode_command(command))
        assert limits.MAX_COMMIT_COMMAND_BYTES - 16 * 1024 < size <= limits.MAX_COMMIT_COMMAND_BYTES
        assert len(command.writes[0].add) == limits.MAX_FILES_PER_COMMIT


def test_rounds_at_the_loose_entry_bound_end_at_it() -> None:
    params = bench_apply.Params.for_mode(quick=False, rounds=3)
    bound = limits.MAX_FILE_ENTRIES_PER_TABLE
    assert max(params.table_sizes) == bound
    assert params.start_size("add", bound) + 3 * params.files_per_commit == bound
    assert params.start_size("overwrite", bound) + params.files_per_commit == bound
    assert params.start_size("add", 100_000) == 100_000
