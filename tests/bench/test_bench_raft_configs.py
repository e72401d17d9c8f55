"""The Raft benchmark's variants (`bench.bench_raft`): which configurations run, with which node
flags, and how ours is compared with the best pysyncobj configuration per metric.

Pure parts only: no node process is started and pysyncobj is not imported (it is a bench extra,
not installed by `make test`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from bench import bench_raft as br


def _result(
    name: str,
    *,
    throughput: float | None = None,
    p50: float | None = None,
    p99: float | None = None,
    failover: tuple[float, float] | None = None,
) -> br.EngineResult:
    return br.EngineResult(
        engine=name,
        complete=True,
        throughput=None
        if throughput is None
        else br.ThroughputResult(runs_per_s=[throughput], median_per_s=throughput),
        latency=None
        if p50 is None
        else br.LatencyResult(samples=1, p50_ms=p50, p99_ms=p99 or p50, mean_ms=p50),
        failover=None
        if failover is None
        else br.FailoverResult(times_s=list(failover), median_s=failover[0], max_s=failover[1]),
    )


def _run() -> dict[str, br.EngineResult]:
    """Ours wins p50 and failover; each pysyncobj variant is best at something."""
    return {
        br.OURS: _result(br.OURS, throughput=20_000, p50=0.5, p99=3.0, failover=(0.3, 0.5)),
        br.OURS_NOFSYNC: _result(
            br.OURS_NOFSYNC, throughput=40_000, p50=0.25, p99=1.0, failover=(0.3, 0.4)
        ),
        br.PYSYNCOBJ_BATCH: _result(
            br.PYSYNCOBJ_BATCH, throughput=10_000, p50=100.0, p99=110.0, failover=(0.4, 0.6)
        ),
        br.PYSYNCOBJ_NOBATCH: _result(
            br.PYSYNCOBJ_NOBATCH, throughput=8_000, p50=0.6, p99=2.0, failover=(0.5, 0.55)
        ),
    }


# --- variants and --engines -------------------------------------------------------------------
def test_default_runs_all_four_variants_ours_first() -> None:
    assert br.ENGINE_NAMES == (
        "ours",
        "ours-nofsync",
        "pysyncobj-batch",
        "pysyncobj-nobatch",
    )
    assert br.parse_engines("all") == list(br.ENGINE_NAMES)


def test_pysyncobj_group_means_both_configurations() -> None:
    assert br.parse_engines("ours,pysyncobj") == ["ours", "pysyncobj-batch", "pysyncobj-nobatch"]
    assert br.parse_engines("pysyncobj-nobatch, ours") == ["pysyncobj-nobatch", "ours"]
    # Repeats (also through a group) run once, in first-seen order.
    assert br.parse_engines("pysyncobj-batch,pysyncobj,ours,ours") == [
        "pysyncobj-batch",
        "pysyncobj-nobatch",
        "ours",
    ]


@pytest.mark.parametrize("text", ["", " , ", "ours,raftos", "pysyncobj-fast"])
def test_unknown_or_empty_engine_lists_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--engines"):
        br.parse_engines(text)


def test_each_variant_starts_its_nodes_with_its_own_flags(tmp_path: Path) -> None:
    params = br.BenchParams.for_mode(quick=True)
    commands = {}
    for name, spec in br.ENGINES.items():
        workdir = tmp_path / name
        workdir.mkdir()
        commands[name] = br.Cluster(spec, workdir, params)._command(1)
    assert commands["ours"][2] == commands["ours-nofsync"][2] == "raft.echo_node"
    assert commands["pysyncobj-batch"][2] == commands["pysyncobj-nobatch"][2]
    assert commands["pysyncobj-batch"][2] == "bench.pysyncobj_node"
    # Durability is on unless the variant says otherwise; batching is pysyncobj's default.
    assert "--no-fsync" not in commands["ours"]
    assert commands["ours-nofsync"][-1] == "--no-fsync"
    assert "--no-batch" not in commands["pysyncobj-batch"]
    assert commands["pysyncobj-nobatch"][-1] == "--no-batch"


# --- comparisons ------------------------------------------------------------------------------
def test_ours_is_compared_with_the_best_pysyncobj_variant_per_metric() -> None:
    compared = br.compare(_run(), br.BASELINE_NAMES)
    throughput = compared["throughput_per_s"]
    assert (throughput.other_variant, throughput.other) == ("pysyncobj-batch", 10_000)
    assert throughput.ratio == pytest.approx(2.0)
    p50 = compared["latency_p50_ms"]
    assert (p50.other_variant, p50.other, p50.ours) == ("pysyncobj-nobatch", 0.6, 0.5)
    assert p50.ratio == pytest.approx(0.5 / 0.6)
    assert compared["latency_p99_ms"].other_variant == "pysyncobj-nobatch"
    assert compared["failover_median_s"].other_variant == "pysyncobj-batch"
    assert compared["failover_max_s"].other_variant == "pysyncobj-nobatch"
    assert br.compute_ratios(_run()) == {key: c.ratio for key, c in compared.items()}


def test_durability_cost_is_ours_over_ours_nofsync() -> None:
    cost = br.compare(_run(), (br.OURS_NOFSYNC,))
    assert cost["throughput_per_s"].ratio == pytest.approx(0.5)
    assert cost["latency_p50_ms"].ratio == pytest.approx(2.0)
    measured = [c for c in cost.values() if c.ours is not None]  # _run() has no CPU figures
    assert len(measured) == 5
    assert {c.other_variant for c in measured} == {"ours-nofsync"}


def test_a_variant_that_measured_nothing_is_not_the_best() -> None:
    results = _run()
    results[br.PYSYNCOBJ_NOBATCH] = br.EngineResult(
        engine=br.PYSYNCOBJ_NOBATCH, complete=False, error="boom", error_code="node_crashed"
    )
    p50 = br.compare(results, br.BASELINE_NAMES)["latency_p50_ms"]
    assert p50.other_variant == "pysyncobj-batch"
    del results[br.PYSYNCOBJ_BATCH], results[br.PYSYNCOBJ_NOBATCH]
    p50 = br.compare(results, br.BASELINE_NAMES)["latency_p50_ms"]
    assert (p50.other_variant, p50.other, p50.ratio) == (None, None, None)


def test_p50_target_is_judged_against_the_best_pysyncobj_p50() -> None:
    results = _run()
    targets = br.evaluate_targets(results, br.compute_ratios(results))
    assert targets["latency_p50_vs_best_pysyncobj"]["met"] is True
    assert targets["throughput_ratio"]["met"] is True  # 20k vs the best 10k: exactly 2x
    results[br.OURS] = _result(br.OURS, throughput=20_000, p50=0.7, failover=(0.3, 0.5))
    targets = br.evaluate_targets(results, br.compute_ratios(results))
    assert targets["latency_p50_vs_best_pysyncobj"]["met"] is False
    assert targets["latency_p50_ms"]["met"] is True  # the absolute target still holds
    # No baseline ran: unknown, not met.
    targets = br.evaluate_targets({br.OURS: results[br.OURS]}, {})
    assert targets["latency_p50_vs_best_pysyncobj"]["met"] is None


def test_tables_name_the_best_variant_and_every_consistency_check() -> None:
    results = _run()
    vs_baseline = br.compare(results, br.BASELINE_NAMES)
    vs_nofsync = br.compare(results, (br.OURS_NOFSYNC,))
    targets = br.evaluate_targets(results, {k: c.ratio for k, c in vs_baseline.items()})
    console = Console(width=200, record=True)
    for table in br.render_tables(results, vs_baseline, vs_nofsync, targets):
        console.print(table)
    text = console.export_text()
    for name in br.ENGINE_NAMES:
        assert name in text
    assert "10,000 (pysyncobj-batch)" in text
    assert "0.60 (pysyncobj-nobatch)" in text
    assert "<=best met" in text
    # No variant reported consistency here: each column says why instead of "yes".
    assert "acked writes kept" in text
    assert " yes " not in text


# --- CPU per proposal -------------------------------------------------------------------------
def test_cpu_per_proposal_is_compared_only_where_measured() -> None:
    results = _run()
    results[br.PYSYNCOBJ_NOBATCH] = br.EngineResult(
        engine=br.PYSYNCOBJ_NOBATCH,
        complete=True,
        latency=br.LatencyResult(
            samples=1, p50_ms=0.6, p99_ms=2.0, mean_ms=0.6, cpu_us_per_proposal=700.0
        ),
    )
    results[br.OURS] = br.EngineResult(
        engine=br.OURS,
        complete=True,
        latency=br.LatencyResult(
            samples=1, p50_ms=0.5, p99_ms=3.0, mean_ms=0.5, cpu_us_per_proposal=1050.0
        ),
    )
    cpu = br.compare(results, br.BASELINE_NAMES)["latency_cpu_us"]
    # pysyncobj-batch has latency but no CPU figure (not Linux, say): it is not "best" at 0.
    assert (cpu.other_variant, cpu.other, cpu.ratio) == ("pysyncobj-nobatch", 700.0, 1.5)
    measured, _ = br.render_tables(
        results,
        br.compare(results, br.BASELINE_NAMES),
        br.compare(results, (br.OURS_NOFSYNC,)),
        br.evaluate_targets(results, br.compute_ratios(results)),
    )
    console = Console(width=200, record=True)
    console.print(measured)
    assert "CPU per proposal" in console.export_text()


def test_schedstat_counts_this_process_cpu_time() -> None:
    """Linux only, like CI and the benchmark machine."""
    before = br.schedstat_ns(os.getpid())
    assert before is not None
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass
    after = br.schedstat_ns(os.getpid())
    assert after is not None
    assert after[0] - before[0] >= 40_000_000  # ns on CPU
    assert br.schedstat_ns(2**22 + 12345) is None  # no such process
