"""`table optimize` size options are checked where they are parsed: a size of 0, or a target
below the minimum, is a usage error (exit 2) before anything is asked of a cluster."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli.main import cli

BASE = ["--endpoints", "127.0.0.1:1", "--token", "t"]  # never reached: refused while parsing


@pytest.mark.parametrize(
    "options",
    [
        ["--target-file-size", "0"],
        ["--target-file-size", "1000"],  # below the 1 KiB minimum
        ["--small-file-size", "0"],
        ["--target-file-size", "0MiB"],
    ],
)
def test_sizes_out_of_range_are_usage_errors(options: list[str]) -> None:
    out = CliRunner().invoke(cli, [*BASE, "table", "optimize", "ns.t", "--dry-run", *options])
    assert out.exit_code == 2, out.output
    assert "at least" in out.output


def test_the_summary_line_says_what_the_counts_count() -> None:
    """`table optimize --dry-run` ended its summary "... (6489 bytes) into about 1", and a run
    "... rewritten into 1 in 1 commit(s)": the written count named no unit."""
    from spark_bridge.optimize import OptimizeResult

    counts = {
        "table": "sales.orders",
        "files_before": 5,
        "small_files": 5,
        "files_rewritten": 5,
        "files_written": 1,
        "bytes_rewritten": 6489,
        "rows_rewritten": 15,
        "attempts": 1,
    }
    dry = OptimizeResult(**counts, commits=0, commit_ts=None, dry_run=True).line()
    assert dry.endswith("(6489 bytes) into about 1 file(s)"), dry
    done = OptimizeResult(**counts, commits=1, commit_ts=1 << 16).line()
    assert "rewritten into 1 file(s) in 1 commit(s)" in done, done
