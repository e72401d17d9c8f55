"""`bench.bench_ddl_parse` runs end to end: every statement is measured, the costliest one the
limits allow is accepted and the 64 KiB statement of literals is refused, and the JSON holds
what the table printed."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_ddl_parse


def test_the_ddl_parse_bench_measures_every_statement(tmp_path: Path) -> None:
    assert bench_ddl_parse.main(["--rounds", "1", "--results-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("ddlparse-*.json")
    report = json.loads(out.read_text())
    outcomes = {s["name"]: s["outcome"] for s in report["statements"]}
    assert set(outcomes) == set(bench_ddl_parse.STATEMENTS)
    assert outcomes["costliest_allowed"] == "accepted"
    assert outcomes["refused_literals"].startswith("refused LIMIT_EXCEEDED")
    assert all(len(s["cpu_s"]) == 1 and s["cpu_s"][0] >= 0 for s in report["statements"])
