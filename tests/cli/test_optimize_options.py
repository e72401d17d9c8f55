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
